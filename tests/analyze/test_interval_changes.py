"""Snapshots across a live change of the sampling interval (planted: 500 ms, then 5 s from t=10 s, with one
real 30 s hole later): the spacing of the new interval is no gap, the hole still is, and the sampler's
expected snapshot count sums each stretch at its own interval."""

from __future__ import annotations

import numpy as np

from stallwatch.analyze.cost import _expected
from stallwatch.analyze.frames import interval_changes
from stallwatch.analyze.loss import sample_gaps

S = 1_000_000
T0 = 1_763_790_000_000_000
INFO = {"sample_interval_ms": 5000, "sample_intervals": [{"from_us": T0, "sample_interval_ms": 500},
                                                         {"from_us": T0 + 10 * S, "sample_interval_ms": 5000}]}


def test_a_longer_interval_is_no_gap_and_a_real_hole_still_is() -> None:
    ts = np.r_[T0 + np.arange(20) * S // 2, T0 + 15 * S + np.arange(5) * 5 * S, T0 + 65 * S]
    changes = interval_changes(INFO)
    assert sample_gaps("n1", ts, 500.0, changes) == sample_gaps("n1", ts, 5000.0, changes)
    gaps = sample_gaps("n1", ts, 500.0, changes)
    assert [(g.start_us - T0, g.end_us - T0) for g in gaps] == [(35 * S, 65 * S)]
    assert len(sample_gaps("n1", ts, 500.0)) == 6  # judged against 500 ms alone, every 5 s step was a "gap"


def test_expected_snapshots_sum_each_stretch_at_its_interval() -> None:
    assert _expected(T0, T0 + 60 * S, 5000.0, interval_changes(INFO)) == 20 + 10 + 1
    assert interval_changes({"sample_interval_ms": 500}) == []
