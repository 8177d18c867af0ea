"""Steps counted but not timed (`untimed` markers): summed per rank and mode from untrusted args, added to the
step totals and the loop, and the share of the loop that was timed."""

from __future__ import annotations

import pyarrow as pa

from stallwatch.analyze import sampled
from stallwatch.analyze.steps import LoopSpan, StepStat
from stallwatch.records import EVAL, TRAIN


def _markers(rows):
    return pa.table({"node": [r[0] for r in rows], "rank": [r[1] for r in rows], "mode": [r[2] for r in rows],
                     "start_us": pa.array([r[3] for r in rows], pa.int64()),
                     "end_us": pa.array([r[4] for r in rows], pa.int64()), "args": [r[5] for r in rows]})


def test_untimed_markers_are_summed_per_rank_and_mode_and_bad_ones_skipped():
    table = _markers([
        ("a", 0, TRAIN, 1_000, 61_000, '{"steps": 100, "stretches": 3, "us": 50000}'),
        ("a", 0, TRAIN, 70_000, 90_000, '{"steps": 20, "stretches": 1, "us": 99999999}'),  # us capped by its span
        ("a", 0, EVAL, 5_000, 6_000, '{"steps": 4, "stretches": 1, "us": 900}'),
        ("b", 1, TRAIN, 2_000, 3_000, "not json"),
        ("b", 1, TRAIN, 2_000, 3_000, '{"steps": "many"}'),
        ("b", 1, TRAIN, 2_000, 3_000, '{"steps": -5}'),
        ("b", 1, TRAIN, 2_000, 3_000, '[1, 2]'),
        ("b", 1, TRAIN, 2_000, 3_000, '{"steps": 1e999}'),
    ])
    parts = sampled.untimed(table)
    assert parts == [sampled.Untimed("a", 0, EVAL, 4, 1, 900, 5_000, 6_000),
                     sampled.Untimed("a", 0, TRAIN, 120, 4, 70_000, 1_000, 90_000)]
    assert sampled.add_counts({TRAIN: 30, EVAL: 2}, parts) == {TRAIN: 150, EVAL: 6}
    assert sampled.add_counts({}, parts) == {TRAIN: 120, EVAL: 4}


def test_the_loop_takes_in_its_untimed_steps_and_the_timed_share_is_of_its_time():
    parts = [sampled.Untimed("a", 0, TRAIN, 900, 9, 8_000_000, 500_000, 10_500_000)]
    loop = sampled.extend_loop(LoopSpan(0, 10_000_000, 100), parts)
    assert loop == LoopSpan(0, 10_500_000, 1_000)
    assert sampled.extend_loop(None, parts) == LoopSpan(500_000, 10_500_000, 900)
    assert sampled.extend_loop(loop, []) is loop
    share = sampled.timed_share(parts, ranks=2, loop_us=10_000_000)  # one of two ranks sampled
    assert abs(share - 0.6) < 1e-9
    assert sampled.timed_share([], ranks=2, loop_us=10_000_000) == 1.0
    assert sampled.timed_share(parts, ranks=1, loop_us=0) == 1.0


def test_a_sampled_run_says_how_many_steps_were_counted_not_timed():
    parts = [sampled.Untimed("a", 0, TRAIN, 9_000, 9, 1, 0, 1), sampled.Untimed("b", 3, TRAIN, 9_000, 9, 1, 0, 1)]
    (note,) = sampled.notes(parts, {TRAIN: 2_000})
    assert "2 ranks (a/0, b/3)" in note and "18,000 of 20,000 steps (90 %)" in note
    assert sampled.notes([], {TRAIN: 5}) == []


def test_step_statistics_carry_their_ranks_untimed_count():
    stats = [StepStat("a", 0, TRAIN, 100, 1.0, 2.0, 3.0, 7), StepStat("a", 1, TRAIN, 90, 1.0, 2.0, 3.0, 8)]
    parts = [sampled.Untimed("a", 0, TRAIN, 9_000, 9, 1, 0, 1), sampled.Untimed("a", 0, EVAL, 50, 1, 1, 0, 1)]
    assert [s.untimed for s in sampled.with_untimed(stats, parts)] == [9_000, 0]
    assert sampled.with_untimed(stats, []) is stats
