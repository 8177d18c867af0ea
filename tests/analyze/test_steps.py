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


def test_streamed_step_statistics_equal_the_whole_run_computation():
    """Pattern: two nodes × two ranks, training then evaluation with slow steps planted, fed in 37-second slices
    of event starts (a slice edge inside steps, slices without some ranks): the accumulator's statistics, step
    counts per mode and loop spans equal those computed from every event at once."""
    import numpy as np
    import pyarrow.compute as pc

    from stallwatch.analyze.framework_frame import FrameworkColumns
    from stallwatch.analyze.steps import StepStatsAccumulator, loop_spans, steps_per_mode

    from .rules._fw_gen import T0, FwGen

    gen = FwGen()
    for node in ("algo-1", "algo-2"):
        for rank in (0, 1):
            _, end = gen.steps(node=node, rank=rank, n=900, start_us=T0 + rank * 3_000_000, seed=rank,
                               slow={50 * k + 3: 700_000 for k in range(9)})
            gen.steps(node=node, rank=rank, mode=EVAL, n=120, start_us=int(end[-1]) + 1_000_000, seed=rank)
    table = gen.table()  # ordered as the reader returns events: by node, rank, then start
    table = table.take(np.lexsort((table["start_us"].to_numpy(), table["rank"].to_numpy(),
                                   table["node"].cast(pa.string()).to_numpy(zero_copy_only=False))))
    acc = StepStatsAccumulator()
    lo, hi = pc.min(table["start_us"]).as_py(), pc.max(table["start_us"]).as_py()
    for a in range(lo, hi + 1, 37_000_000):
        part = table.filter(pc.and_(pc.greater_equal(table["start_us"], a), pc.less(table["start_us"], a + 37_000_000)))
        acc.add(part)
    whole = step_stats(table)
    assert acc.stats() == whole and len(whole) == 8 and whole[0].max_ms >= 700
    steps = FrameworkColumns(table.filter(pc.equal(table["kind"].cast(pa.string()), STEP)))
    assert acc.per_mode() == steps_per_mode(steps) == {TRAIN: 3600, EVAL: 480}
    assert acc.spans() == loop_spans(steps)
