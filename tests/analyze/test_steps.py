"""Step statistics per rank and mode, from framework events built in the store's schema."""

from __future__ import annotations

import pyarrow as pa

from stallwatch.analyze.steps import step_stats
from stallwatch.records import DATA_WAIT, EVAL, FORWARD, STEP, TRAIN, framework_schema


def _table(rows):
    cols = {f.name: [r[i] for r in rows] for i, f in enumerate(framework_schema())}
    return pa.table(cols, schema=framework_schema())


def _ev(rank, kind, mode, step, start, end):
    return ("n1", rank, 10 + rank, kind, kind, mode, step, start, end, "")


def test_counts_percentiles_slowest_step_and_phase_shares():
    rows = []
    t = 0
    for i in range(10):
        d = 50_000 if i == 6 else 10_000  # step 6 is slow
        rows += [_ev(0, STEP, TRAIN, i, t, t + d), _ev(0, DATA_WAIT, TRAIN, i, t, t + d // 10),
                 _ev(0, FORWARD, TRAIN, i, t + d // 10, t + d // 2)]
        t += d
    rows += [_ev(1, STEP, EVAL, 0, 0, 4_000), _ev(1, STEP, EVAL, 1, 4_000, 6_000)]
    (train, evals) = step_stats(_table(rows))
    assert (train.rank, train.mode, train.steps, train.slowest_step) == (0, TRAIN, 10, 6)
    assert train.p50_ms == 10.0 and train.max_ms == 50.0
    assert round(train.phase_pct[DATA_WAIT]) == 10 and round(train.phase_pct[FORWARD]) == 40
    assert (evals.rank, evals.steps, evals.slowest_step, evals.phase_pct) == (1, 2, 0, {})


def test_no_events_no_stats():
    assert step_stats(framework_schema().empty_table()) == []
