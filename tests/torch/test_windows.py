"""Profiling windows on their own: opened and closed at step boundaries for the configured TRAIN steps or
time window, with real profilers, their output staged and announced once."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from stallwatch.config import ProfilerConfig, ProfilingRange
from stallwatch.records import EVAL, TRAIN
from stallwatch.torch.steps import now_us
from stallwatch.torch.windows import WindowController


def _ended(events: list[tuple]) -> list[tuple]:
    """The windows' own events (written when they stop), not the `started` events written when they began."""
    return [e for e in events if e[0] == "profiling" and json.loads(e[7])["status"] != "started"]


def _controller(tmp_path, **fields):
    events: list[tuple] = []
    sent: list[dict] = []  # artifact messages (what became of each window, the notices, go to c.notices)
    config = ProfilerConfig(**fields)
    notices: list[dict] = []
    c = WindowController(config, pid=os.getpid(), staging=str(tmp_path), emit=events.append,
                         send=lambda m: (notices if "notice" in m else sent).append(m))
    c.notices = notices  # type: ignore[attr-defined]
    return c, events, sent


def test_a_window_past_or_captured_is_told_to_the_sampler(tmp_path):
    """The live dashboard shows what became of a request: the job says so (not only on its stderr)."""
    c, _, _ = _controller(tmp_path)
    c.set_config(ProfilerConfig(detailed_profiling=ProfilingRange(3, 2)), train_steps_done=10)
    (past,) = c.notices
    assert past["notice"]["outcome"] == "past" and "10 training steps done" in past["notice"]["message"]
    assert past["notice"]["range"] == ProfilingRange(3, 2).to_spec()
    c.set_config(ProfilerConfig(dataloader_profiling=ProfilingRange(11, 1)), train_steps_done=10)
    c.on_step_begin("TRAIN", 11, 1_000)
    c.on_step_end("TRAIN", 11, 1_000, 2_000)
    assert [n["notice"]["outcome"] for n in c.notices[1:]] == ["started", "captured"]


def _steps(c: WindowController, modes, work=lambda: sum(i * i for i in range(2000)), pause_s: float = 0.0):
    counts = {TRAIN: 0, EVAL: 0}
    for mode in modes:
        step = counts[mode]
        start = now_us()
        c.on_step_begin(mode, step, start)
        work()
        time.sleep(pause_s)
        c.on_step_end(mode, step, start, now_us())
        counts[mode] += 1


def test_a_cprofile_window_covers_exactly_its_train_steps(tmp_path):
    c, events, sent = _controller(tmp_path, python_profiling=ProfilingRange(2, 2), cprofile_timer="cpu")
    _steps(c, [TRAIN, TRAIN, EVAL, TRAIN, EVAL, TRAIN, TRAIN, TRAIN])
    (msg,) = sent
    art = msg["artifact"]
    assert art["layer"] == "python" and art["meta"]["first_step"] == 2 and art["meta"]["last_step"] == 3
    assert art["meta"]["timer"] == "cpu" and art["meta"]["status"] == "complete"
    assert os.path.getsize(art["files"]["profile.pstats"]) > 0
    assert os.path.dirname(art["files"]["profile.pstats"]).startswith(str(tmp_path))
    (marker,) = _ended(events)
    assert marker[1] == "python" and marker[2] == art["meta"]["start_us"]
    (begun,) = [e for e in events if e[0] == "profiling" and e not in _ended(events)]  # written when it began
    assert begun[1:4] == ("python", marker[2], marker[2]) and json.loads(begun[7])["status"] == "started"


def test_a_detailed_window_stages_a_torch_trace(tmp_path):
    torch = pytest.importorskip("torch")
    c, _, sent = _controller(tmp_path, detailed_profiling=ProfilingRange(1, 1))
    x = torch.randn(16, 16)
    _steps(c, [TRAIN] * 3, work=lambda: x @ x)
    (msg,) = sent
    assert msg["artifact"]["meta"]["profiler"] == "torch.profiler"
    assert msg["artifact"]["meta"]["activities"] == ["cpu"]
    text = open(msg["artifact"]["files"]["trace.json"]).read()
    assert '"aten::mm"' in text and '"ProfilerStep#1"' in text  # numbered as the job's steps


def test_a_pyinstrument_window(tmp_path):
    pytest.importorskip("pyinstrument")
    c, _, sent = _controller(tmp_path, python_profiling=ProfilingRange(0, 1), python_profiler="pyinstrument")
    _steps(c, [TRAIN] * 2, pause_s=0.01)
    (msg,) = sent
    assert set(msg["artifact"]["files"]) == {"pyinstrument.json"}


def test_a_time_window_opens_and_closes_at_step_boundaries(tmp_path):
    start = now_us() + 30_000
    c, events, _ = _controller(tmp_path, dataloader_profiling=ProfilingRange(start_time_us=start, duration_s=0.06))
    _steps(c, [TRAIN] * 12, pause_s=0.02)
    (marker,) = _ended(events)
    assert start <= marker[2] < start + 30_000  # the first boundary inside the window
    assert marker[3] >= start + 60_000  # closed at the first boundary after it


def test_a_window_whose_profiler_cannot_start_is_skipped_with_one_line(tmp_path, caplog):
    torch = pytest.importorskip("torch")
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    c, _, sent = _controller(tmp_path, detailed_profiling=ProfilingRange(0, 2))
    with torch.profiler.profile():  # the user's own profiler holds the profiling session
        _steps(c, [TRAIN] * 3)
    assert sent == []
    assert len([r for r in caplog.records if "cannot start detailed profiling" in r.getMessage()]) == 1


def test_a_window_open_at_exit_is_kept_and_marked_cut_short(tmp_path):
    c, _, sent = _controller(tmp_path, python_profiling=ProfilingRange(1, 100))
    _steps(c, [TRAIN] * 4)
    c.close()
    (msg,) = sent
    assert msg["artifact"]["meta"]["status"] == "cut_short" and msg["artifact"]["meta"]["last_step"] == 3


def test_each_configured_window_runs_once(tmp_path):
    c, events, _ = _controller(tmp_path, dataloader_profiling=ProfilingRange(0, 1))
    _steps(c, [TRAIN] * 2)
    c.set_config(c.config.replace(python_profiling=ProfilingRange(5, 1)), train_steps_done=2)
    _steps(c, [TRAIN] * 8)  # a new counter here: steps 0..7 again, the dataloader window must not rerun
    assert [e[1] for e in _ended(events)] == ["dataloader", "python"]


def test_a_python_window_never_replaces_the_users_own_profiler(tmp_path):
    import cProfile

    c, _, sent = _controller(tmp_path, python_profiling=ProfilingRange(0, 1))
    mine = cProfile.Profile()
    mine.enable()
    try:
        _steps(c, [TRAIN] * 2)
    finally:
        mine.disable()
    assert sent == []
    assert mine.getstats()  # the user's profile kept recording


# -- what a live change that can never run says, and the cap on a detailed window ---------------------------------

def _said(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_a_live_time_window_already_past_is_said_so(tmp_path, caplog):
    """A step window already past was said so; a time window already past was dropped without a word."""
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    c, events, _ = _controller(tmp_path)
    _steps(c, [TRAIN] * 2)
    past = ProfilingRange(start_time_us=now_us() - 120_000_000, duration_s=30)
    c.set_config(c.config.replace(dataloader_profiling=past), train_steps_done=2)
    _steps(c, [TRAIN] * 2)
    (line,) = _said(caplog, "already past")
    assert "dataloader_profiling" in line and "ended 90 s ago" in line
    assert [e for e in events if e[0] == "profiling"] == []


def test_a_live_window_that_ran_already_is_said_so(tmp_path, caplog):
    """Cleared, then set again to the range that already ran: nothing happened, and nothing said why."""
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    c, events, _ = _controller(tmp_path, dataloader_profiling=ProfilingRange(5, 1))
    _steps(c, [TRAIN] * 7)
    c.set_config(c.config.replace(dataloader_profiling=None), train_steps_done=7)
    c.set_config(c.config.replace(dataloader_profiling=ProfilingRange(5, 1)), train_steps_done=7)
    (line,) = _said(caplog, "ran already")
    assert "dataloader_profiling 5:1" in line and "give another range" in line
    assert len(_ended(events)) == 1


def test_a_detailed_time_window_stops_after_the_step_cap(tmp_path, caplog):
    """A time window holds any number of steps; torch.profiler keeps them all in the job's memory (10,000
    steps: 1.5 GB), so a detailed window stops at MAX_DETAILED_STEPS, said in one line."""
    torch = pytest.importorskip("torch")
    from stallwatch.config import MAX_DETAILED_STEPS

    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    window = ProfilingRange(start_time_us=now_us(), duration_s=300)
    c, _, sent = _controller(tmp_path, detailed_profiling=window)
    x = torch.randn(4, 4)
    _steps(c, [TRAIN] * (MAX_DETAILED_STEPS + 20), work=lambda: x @ x)
    (msg,) = sent
    assert msg["artifact"]["meta"]["status"] == "capped"
    text = open(msg["artifact"]["files"]["trace.json"]).read()
    assert text.count('"ProfilerStep#') == MAX_DETAILED_STEPS
    (line,) = _said(caplog, "detailed profiling stopped after")
    assert f"after {MAX_DETAILED_STEPS} steps" in line
