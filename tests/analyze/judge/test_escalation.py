"""Escalation on a real run: the planted stalls of a starved loop make a live rule fire, which asks for a
detailed capture on its own; the capture covers a stalled step, is recorded with its trigger and listed in the
report. Within its budget: none with --escalate off, none past the budget."""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.judge.escalation import Escalation
from stallwatch.config import ProfilerConfig
from stallwatch.records import STEP, TRAIN
from stallwatch.store import run_files
from stallwatch.store.location import RunLocation
from tests.analyze.test_accuracy import _script
from tests.collect._support import Background

STALLS = list(range(20, 600, 9))  # a 0.3 s stall every 9 steps, all through the run
JOB = dict(sample_s=0.0, compute_s=0.005, stalls=STALLS, steps=600, workers=0)
AFTER_CAPTURE = 200  # steps the job runs once the first capture is over


def _capture_asked(run) -> dict | None:
    """The first escalation record of the run, once the launcher has written one."""
    try:
        return next(iter(run_files.read_escalations(RunLocation(str(run)))), None)
    except OSError:  # the run's directory being made
        return None


def test_planted_stalls_trigger_a_capture_that_covers_a_stalled_step(tmp_path):
    """Once the capture's window is over, the job is told to run AFTER_CAPTURE more steps (of its 600) and end:
    enough for MemoryGrowth to judge the steps after the capture (10 windows of 20), the rest would add nothing."""
    run = tmp_path / "run"
    stop = tmp_path / "stop"
    script = _script(tmp_path, stop=stop, after=AFTER_CAPTURE, **JOB)
    job = Background(tmp_path, "run", "--out", str(run), "--rules-interval", "1", "--escalate-every", "60",
                     "--escalate-budget", "100", "--", sys.executable, str(script), str(tmp_path / "onset.json"))
    try:
        deadline = time.time() + 240
        while time.time() < deadline and job.proc.poll() is None:
            asked = _capture_asked(run)
            # the window ends at its end_us, or after 100 steps if sooner (at the first step boundary after either)
            if asked is not None and time.time() > asked["end_us"] / 1e6 + 1:
                stop.touch()
                break
            time.sleep(0.2)
        assert job.wait(300) == 0, job.stderr
    finally:
        job.kill_all()
    stderr = job.stderr
    analysis = RunAnalysis(str(run))
    (first, *_) = analysis.escalations
    assert first["rule"] in ("InputBound", "StepOutlier", "Dataloader") and "detailed" in first["layers"]
    assert "dataloader" in first["layers"] and first["evidence"]["triggered"] > 0
    assert "capturing detailed" in stderr
    windows = [w for w in analysis.profiles("detailed") if w.get("start_us", 0) >= first["start_us"] - 2_000_000]
    assert windows, analysis.profiles("detailed")
    window = windows[0]
    steps = [e for e in analysis.run.framework(kinds=[STEP]).to_pylist() if e["mode"] == TRAIN]
    stalled = [e for e in steps if e["step"] in STALLS and e["end_us"] - e["start_us"] > 250_000]
    lo, hi = window["start_us"], window.get("end_us") or first["end_us"]
    assert any(lo <= e["start_us"] and e["end_us"] <= hi for e in stalled), (window, len(stalled))
    assert [c.status for c in analysis.captures][:1] == ["stored"] and window["path"] in analysis.captures[0].windows
    html = (run / "report.html").read_text()
    assert "Automatic captures" in html and "stored (" in html and "never stored" not in html
    # the captures' memory (torch.profiler's events, the buffers the allocator keeps) is no leak of the job's: on a
    # loaded machine MemoryGrowth fired on it once (docs/accuracy.md); its steps are now left out
    memory = analysis.rule("MemoryGrowth")
    assert memory.details["series"], memory.details  # the steps were judged (not too few of them)
    assert not memory.fired and all(g["left_out"] >= 1 for g in memory.details["series"].values()), memory.details


class _Result(SimpleNamespace):
    pass


def test_budget_interval_and_off(tmp_path):
    loc = RunLocation(str(tmp_path / "run"))
    run_files.write_config(loc, ProfilerConfig())
    fired = [_Result(name="InputBound", triggered=1, violations=3, details={"title": "waits"})]
    start = 1_800_000_000_000_000
    esc = Escalation(ProfilerConfig(escalate_budget_pct=2.0), loc, start)
    esc.on_results(fired, now_us=start + 10_000_000)  # 10 s in: 5 s of capture would be 50 %, over 2 %
    assert esc.records == [] and run_files.read_escalations(loc) == []
    esc.on_results([_Result(name="InputBound", triggered=2, violations=4, details={})], now_us=start + 400_000_000)
    assert [r["rule"] for r in esc.records] == ["InputBound"]  # 400 s in: 5 s is 1.25 %
    assert run_files.read_config(loc).detailed_profiling is not None
    assert run_files.read_config(loc).dataloader_profiling is not None
    esc.on_results([_Result(name="InputBound", triggered=3, violations=5, details={})], now_us=start + 900_000_000)
    assert len(esc.records) == 1  # once per rule per escalate_every_s
    off = Escalation(ProfilerConfig(escalate=False), loc, start)
    off.on_results([_Result(name="StepOutlier", triggered=1, violations=1, details={})], now_us=start + 900_000_000)
    assert off.records == []
    (record,) = run_files.read_escalations(loc)
    assert record["rule"] == "InputBound" and record["layers"] == ["detailed", "dataloader"]


def test_escalate_flag(run_stallwatch, tmp_path):
    run = tmp_path / "run"
    p = run_stallwatch("run", "--out", str(run), "--escalate", "off", "--", sys.executable, "-c", "pass")
    assert p.returncode == 0, p.stderr
    assert json.loads((run / "config.json").read_text())["escalate"] is False
    with pytest.raises(Exception, match="escalate_budget_pct"):
        ProfilerConfig(escalate_budget_pct=200)


def test_memory_growth_asks_for_a_memory_window_within_the_budget(tmp_path):
    """MemoryGrowth's capture is a `memory_profiling` window (no operators), counted as its 5 s bound."""
    loc = RunLocation(str(tmp_path / "run"))
    run_files.write_config(loc, ProfilerConfig())
    start = 1_800_000_000_000_000
    esc = Escalation(ProfilerConfig(escalate_budget_pct=2.0), loc, start)
    grows = [_Result(name="MemoryGrowth", triggered=1, violations=1, details={"title": "grows"})]
    esc.on_results(grows, now_us=start + 200_000_000)  # 200 s in: 5 s would be 2.5 %, over 2 %
    assert esc.records == []
    esc.on_results([_Result(name="MemoryGrowth", triggered=2, violations=2, details={})], now_us=start + 300_000_000)
    (record,) = esc.records
    assert record["layers"] == ["memory"] and esc.captured_s == 5.0
    config = run_files.read_config(loc)
    assert config.memory_profiling is not None and config.memory_profiling.start_time_us == start + 301_000_000
    assert config.detailed_profiling is None


def test_a_rule_that_fired_before_the_budget_had_room_gets_its_capture_once_it_has(tmp_path):
    """A leak found 3 s into a job fires once and keeps firing with the same count: its capture is asked for at the
    first evaluation the budget allows, not never; a rule that stopped firing is not asked for."""
    loc = RunLocation(str(tmp_path / "run"))
    run_files.write_config(loc, ProfilerConfig())
    start = 1_800_000_000_000_000
    esc = Escalation(ProfilerConfig(escalate_budget_pct=100.0), loc, start)
    grows = [_Result(name="MemoryGrowth", triggered=1, violations=1, details={}),
             _Result(name="InputBound", triggered=1, violations=1, details={})]
    esc.on_results(grows, now_us=start + 3_000_000)  # 3 s in: a 5 s capture would be 167 % of the job so far
    assert esc.records == []
    quiet = _Result(name="InputBound", triggered=0, violations=0, details={})
    esc.on_results([grows[0], quiet], now_us=start + 6_000_000)  # the same count, 6 s in: room for 5 s
    assert [r["rule"] for r in esc.records] == ["MemoryGrowth"]
    esc.on_results([grows[0], quiet], now_us=start + 60_000_000)
    assert len(esc.records) == 1
