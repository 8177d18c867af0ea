"""The sampler's live counts from the events a job sends: steps per rank and mode (counted steps too), the newest
step, the loop's span, phase time, a progress curve that stays bounded, and the job's profiling notices."""

from __future__ import annotations

import json
from pathlib import Path

from stallwatch.collect.live_counts import LiveCounts
from stallwatch.records import FrameworkEvent
from stallwatch.store.live_status import MAX_PROGRESS, read_live
from stallwatch.store.location import RunLocation


def _step(step: int, start: int, mode: str = "TRAIN") -> list[FrameworkEvent]:
    return [FrameworkEvent("step", "step", start, start + 10, mode, step, 42, ""),
            FrameworkEvent("forward", "forward", start + 1, start + 4, mode, step, 42, "")]


def test_counts_reach_the_file(tmp_path: Path) -> None:
    loc = RunLocation(str(tmp_path))
    counts = LiveCounts("n1", every_s=0.0)
    counts.add(0, _step(0, 100) + _step(1, 200) + _step(0, 300, "EVAL"))
    counts.add(0, [FrameworkEvent("untimed", "untimed", 400, 900, "TRAIN", None, 42, json.dumps({"steps": 50}))])
    counts.add(1, _step(7, 150))
    counts.notice(0, {"layer": "detailed", "range": "9:1", "outcome": "past", "message": "already past"}, 950)
    counts.tick(loc, 1000)
    live = read_live(loc, ["n1"])["n1"]
    r0, r1 = live.ranks
    assert r0.steps == {"TRAIN": 52, "EVAL": 1} and r0.last_step == {"TRAIN": 1, "EVAL": 0} and r0.pid == 42
    assert (r0.first_us, r0.last_us) == (100, 900) and r1.last_step == {"TRAIN": 7}
    assert live.step_us == {"TRAIN": 30, "EVAL": 10} and live.phase_us["TRAIN"] == {"forward": 9}
    assert live.progress == ((1000, 54),) and live.notices[0].message == "already past"


def test_progress_stays_bounded_and_spans_the_run(tmp_path: Path) -> None:
    loc = RunLocation(str(tmp_path))
    counts = LiveCounts("n1", every_s=0.0)
    for k in range(3 * MAX_PROGRESS):
        counts.add(0, _step(k, k * 1000))
        counts.tick(loc, k * 1000 + 500)
    progress = read_live(loc, ["n1"])["n1"].progress
    assert len(progress) <= MAX_PROGRESS
    assert progress[0] == (500, 1) and progress[-1][1] == 3 * MAX_PROGRESS


def test_the_newest_snapshots_node_wide_only(tmp_path: Path) -> None:
    from stallwatch.records import MetricKey

    loc = RunLocation(str(tmp_path))
    keys = [MetricKey("cpu", "cpu_util"), MetricKey("cpu0", "cpu_util"), MetricKey("memory", "mem_util"),
            MetricKey("gpu0", "gpu_util"), MetricKey("proc", "rss_bytes")]
    counts = LiveCounts("n1", every_s=0.0)
    for k in range(40):
        counts.snapshot(k * 500_000, keys, [50.0, 60.0, float("nan"), 7.0, 1e9])
    counts.tick(loc, 20_000_000)
    live = read_live(loc, ["n1"])["n1"]
    assert live.columns == ("cpu/cpu_util", "memory/mem_util", "gpu0/gpu_util")
    assert len(live.snapshots) == 24 and live.snapshots[-1] == (39 * 500_000, (50.0, None, 7.0))
