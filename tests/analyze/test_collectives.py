"""DDP's gradient all-reduce per step from its own sampled timing: the newest sample's averages, scaled to the
rank's training steps; malformed samples are skipped."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from stallwatch.analyze.collectives import gradient_sync


def _samples(rows):
    return pa.table({"node": [r[0] for r in rows], "rank": [r[1] for r in rows], "start_us": [r[2] for r in rows],
                     "args": [r[3] for r in rows]})


def _args(comm, overlap, backward):
    return json.dumps({"avg_backward_comm_time_us": comm, "avg_backward_compute_comm_overlap_time_us": overlap,
                       "avg_backward_compute_time_us": backward})


def test_newest_sample_per_rank_scaled_to_its_steps():
    table = _samples([("n1", 0, 10, _args(4000, 1000, 9000)), ("n1", 0, 20, _args(3000, 1000, 8000)),
                      ("n1", 1, 15, _args(2000, 2500, 7000)), ("n1", 1, 16, "not json"), ("n2", 0, 5, "{}")])
    (r0, r1) = gradient_sync(table, {("n1", 0): 100, ("n1", 1): 50})
    assert (r0.rank, r0.samples, r0.comm_ms, r0.overlap_ms, r0.backward_ms) == (0, 2, 3.0, 1.0, 8.0)
    assert r0.exposed_ms == 2.0 and r0.exposed_total_s == pytest.approx(0.2) and r0.comm_total_s == pytest.approx(0.3)
    assert r1.overlap_ms == 2.0 and r1.exposed_ms == 0.0 and r1.overlap_pct == 100.0  # overlap capped at comm
    assert r1.samples == 1 and r1.train_steps == 50


def test_no_samples_no_rows():
    assert gradient_sync(_samples([]).cast(pa.schema([("node", pa.string()), ("rank", pa.int64()),
                                                      ("start_us", pa.int64()), ("args", pa.string())])), {}) == []
