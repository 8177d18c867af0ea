"""Cost of profiling: the sampler's accounting and the storage as measured in the run, the sampler's own usage
when recorded, the slowdown inside a detailed-profiling window, and benchmark figures labelled as such."""

from __future__ import annotations

import json

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.report.model import GOOD, INFO, WARN, Paragraph, Table, Verdict
from stallwatch.present.report.sections import overhead
from stallwatch.store import layout
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import FwGen
from tests.analyze.rules._gen import INTERVAL_US, START_US, make_node
from tests.present.generated_run import S, write_run


def _section(path):
    (sec,) = overhead.build(RunAnalysis(open_run(str(path))))
    return sec


def _table(sec, caption_start: str) -> Table:
    return next(b for b in sec.blocks if isinstance(b, Table) and b.caption.startswith(caption_start))


def _text(sec) -> str:
    return " ".join(b.text for b in sec.blocks if isinstance(b, Paragraph))


def _steps_run(path, *, step_us: int = 100_000, records=None, window=None):
    frame = make_node("algo-1", 1200, 4, 1)
    fw = FwGen()
    fw.steps(n=2000, start_us=START_US + 30 * S, step_us=step_us, jitter_us=0, gap_us=0)
    write_run(path, [frame], fw.table(), records=records)
    return path


def test_sampler_accounting_and_estimates(tmp_path):
    sec = _section(_steps_run(tmp_path / "run"))
    assert sec.id == "overhead" and sec.title == "Cost of profiling"
    (row,) = _table(sec, "System sampler, measured").rows
    assert row == ["algo-1", 500, 1201, 1200, 0, 0, 0.0]
    text = _text(sec)
    assert "does not record the sampler's own CPU time" in text
    assert "Benchmark: 556 µs of CPU per snapshot" in text and "Estimate for this run: 1,200 snapshots" in text
    assert "Benchmark: +15.4 µs per step" in text
    assert "Measured in this run: 2,000 steps, median step 100 ms" in text
    assert "15.4 µs × 2,000 steps" in text and "0.015 % of the median step" in text
    (verdict,) = [b for b in sec.blocks if isinstance(b, Verdict)]
    assert verdict.level == GOOD


def test_storage_is_the_run_files(tmp_path):
    run = _steps_run(tmp_path / "run")
    rows = {r[0]: r for r in _table(_section(run), "Storage").rows}
    system = sum(p.stat().st_size for p in (run / "system").rglob("*") if p.is_file())
    framework = sum(p.stat().st_size for p in (run / "framework").rglob("*") if p.is_file())
    assert rows["System metrics"][1] == pytest.approx(system / 1e6, abs=1e-3)
    assert rows["Framework events"][1] == pytest.approx(framework / 1e6, abs=1e-3)
    hours = (1200 * INTERVAL_US) / 3.6e9
    assert rows["System metrics"][2] == pytest.approx(system / 1e6 / hours, rel=0.01)


def test_measured_sampler_usage_when_recorded(tmp_path):
    records = {"algo-1": {"sampler_cpu_s": 1.2, "sampler_max_rss_bytes": 80_000_000}}
    sec = _section(_steps_run(tmp_path / "run", records=records))
    (row,) = _table(sec, "System sampler's own usage").rows
    duration_s = (1200 * INTERVAL_US) / 1e6  # start to sampler end: 1200 snapshots
    assert row == ["algo-1", 1.2, round(100 * 1.2 / duration_s, 3), 1000, 80.0]
    assert "does not record the sampler's own" not in _text(sec)


def test_sampler_trouble_warns(tmp_path):
    records = {"algo-1": {"ticks_missed": 60, "samples_dropped": 10}}
    sec = _section(_steps_run(tmp_path / "run", records=records))
    (verdict,) = [b for b in sec.blocks if isinstance(b, Verdict)]
    assert verdict.level == WARN and "dropped 10 snapshots" in verdict.text and "missed 60 ticks (5.0 %" in verdict.text


def test_tiny_steps_make_the_estimate_matter(tmp_path):
    sec = _section(_steps_run(tmp_path / "run", step_us=500))
    (verdict,) = [b for b in sec.blocks if isinstance(b, Verdict)]
    assert verdict.level == INFO and "estimated 3.1 % of each step" in verdict.text


def test_detailed_window_slowdown_measured(tmp_path):
    frame = make_node("algo-1", 1200, 4, 1)
    fw = FwGen()
    t = START_US + 30 * S
    s, e = fw.steps(n=100, start_us=t, step_us=100_000, jitter_us=0, gap_us=0)
    s, e = fw.steps(n=10, first_step=100, start_us=int(e[-1]), step_us=150_000, jitter_us=0, gap_us=0)
    window = (int(s[0]), int(e[-1]))
    s, e = fw.steps(n=1, first_step=110, start_us=window[1], step_us=400_000, jitter_us=0, gap_us=0)
    fw.steps(n=100, first_step=111, start_us=int(e[-1]), step_us=100_000, jitter_us=0, gap_us=0)
    run = write_run(tmp_path / "run", [frame], fw.table())
    name = layout.window_name("detailed", window[0])
    folder = run / layout.trace_window_dir("algo-1", 0, name)
    folder.mkdir(parents=True)
    (folder / layout.WINDOW_JSON).write_text(json.dumps({
        "layer": "detailed", "start_us": window[0], "end_us": window[1], "mode": "TRAIN", "first_step": 100,
        "last_step": 109, "pid": 1000, "profiler": "torch.profiler", "status": "complete", "node": "algo-1",
        "rank": 0, "window": name, "files": []}))
    (row,) = _table(_section(run), "Detailed-profiling windows").rows
    assert row == ["algo-1/0", name, 10, 150.0, 100.0, 50.0, 400.0]


def test_no_framework_costs_nothing(tmp_path):
    run = write_run(tmp_path / "run", [make_node("algo-1", 100, 2, 0)])
    sec = _section(run)
    assert "No training steps were recorded" in _text(sec)
    (verdict,) = [b for b in sec.blocks if isinstance(b, Verdict)]
    assert verdict.level == GOOD
