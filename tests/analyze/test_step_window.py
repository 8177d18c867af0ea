"""Time buckets of framework events as the dashboard's timeline draws a range too busy to draw event by event."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stallwatch.analyze.step_window import EventBucket, buckets_of, event_buckets


def test_each_bucket_has_its_steps_mean_step_and_phases_per_step():
    starts = np.array([0, 0, 0, 60, 60, 120])
    kinds = np.array(["step", "forward", "backward", "step", "data_wait", "forward"])
    sums = np.array([3_000, 1_000, 1_500, 8_000, 0, 700])
    counts = np.array([3, 3, 3, 2, 1, 1])
    assert buckets_of(starts, kinds, sums, counts, 60) == [
        EventBucket(0, 60, 3, 1.0, {"forward": pytest.approx(1 / 3), "backward": 0.5}),
        # a phase present with no time is listed (it happened); the bucket without a step is left out
        EventBucket(60, 60, 2, 4.0, {"data_wait": 0.0}),
    ]


def test_raw_events_fall_in_equal_buckets_by_their_start():
    start = np.array([0, 10, 95, 99])
    end = start + np.array([4, 2, 1, 3])
    got = event_buckets(np.array(["step", "forward", "step", "step"]), start, end, 0, 100, n=2)
    assert [(b.start_us, b.width_us, b.steps, b.step_ms * 1000) for b in got] == [(0, 50, 1, 4.0), (50, 50, 2, 2.0)]
    assert got[0].phases_ms == {"forward": 0.002}


def _events(rows: list[tuple[str, str, int, int]]) -> Any:
    """Events of rank 0 on node vm: (kind, name, start_us, end_us), step 0, TRAIN."""
    import pyarrow as pa

    from stallwatch.records import framework_schema

    cols = {"node": ["vm"] * len(rows), "rank": [0] * len(rows), "pid": [1] * len(rows),
            "kind": [r[0] for r in rows], "name": [r[1] for r in rows], "mode": ["TRAIN"] * len(rows),
            "step": [0] * len(rows), "start_us": [r[2] for r in rows], "end_us": [r[3] for r in rows],
            "args": ["{}"] * len(rows)}
    return pa.table(cols).cast(framework_schema())


def test_a_ddp_step_shows_its_exposed_all_reduce_apart_from_backward():
    """DDP's exposed all-reduce is timed inside backward: the step's bars show it as communication and
    backward's own time without it (before, the DDP Nodes view showed no communication at all)."""
    from stallwatch.analyze.step_window import EVENT_KINDS, step_breakdown

    table = _events([("step", "step", 0, 100_000), ("forward", "Model", 0, 20_000),
                     ("backward", "backward", 20_000, 90_000), ("collective", "ddp_gradient_sync", 40_000, 85_000),
                     ("optimizer", "SGD", 90_000, 95_000)])
    assert "collective" in EVENT_KINDS
    (step,) = step_breakdown(table)
    assert step.phases_ms == {"forward": 20.0, "backward": 25.0, "collective": 45.0, "optimizer": 5.0}
    assert step.other_ms == pytest.approx(5.0)
