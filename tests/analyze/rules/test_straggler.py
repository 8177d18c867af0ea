"""Straggler on generated events of synchronous data-parallel training: every rank's step lasts as long as the
slowest rank's, the others wait inside backward (DDP) or inside explicit collectives. The rule names the slow
rank (and a node whose ranks all lag), stays silent on equal ranks and on one rank, and gives the same result
for one chunk or many."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze.rules.straggler import Straggler
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, STEP, TRAIN

from ._fw_gen import MS, T0, FwGen, assert_chunk_invariant, evaluate, whole


def synchronous(ranks: list[tuple[str, int]], *, n: int = 400, extra_ms: dict[tuple[str, int], float] | None = None,
                from_step: int = 0, wait_in: str = BACKWARD, seed: int = 0) -> FwGen:
    """`n` TRAIN steps on every rank, in lockstep: each rank works forward 20 ms + its `extra_ms` (from
    `from_step` on) + backward 30 ms, ± 1 ms of noise; the step ends when the slowest rank is done, the others
    waiting inside backward (DDP's all-reduce) or in an explicit all_reduce at the end of the step."""
    gen = FwGen()
    rng = np.random.default_rng(seed)
    extra_ms = extra_ms or {}
    start = T0
    for step in range(n):
        work = {}
        for key in ranks:
            extra = extra_ms.get(key, 0.0) if step >= from_step else 0.0
            work[key] = (20 + extra + rng.uniform(-1, 1)) * MS, (30 + rng.uniform(-1, 1)) * MS
        span = max(f + b for f, b in work.values()) + 2 * MS
        for (node, rank), (f, b) in work.items():
            wait = span - 2 * MS - (f + b)
            t = start
            gen.events(node, rank, STEP, "train_step", TRAIN, step, t, t + span)
            gen.events(node, rank, DATA_WAIT, "next_batch", TRAIN, step, t, t + MS)
            gen.events(node, rank, FORWARD, "Net", TRAIN, step, t + MS, t + MS + f)
            if wait_in == BACKWARD:
                gen.events(node, rank, BACKWARD, "backward", TRAIN, step, t + MS + f, t + MS + f + b + wait)
            else:
                gen.events(node, rank, BACKWARD, "backward", TRAIN, step, t + MS + f, t + MS + f + b)
                gen.events(node, rank, COLLECTIVE, "all_reduce", TRAIN, step, t + MS + f + b, t + MS + f + b + wait)
        start += int(span) + 1000
    return gen


RANKS = [("algo-1", 0), ("algo-1", 1), ("algo-1", 2), ("algo-1", 3)]


@pytest.mark.parametrize("wait_in", [BACKWARD, COLLECTIVE])
def test_the_slow_rank_is_named(wait_in):
    gen = synchronous(RANKS, extra_ms={("algo-1", 2): 15}, wait_in=wait_in)
    out = evaluate(Straggler, whole(gen.table()))
    (s,) = out["Details"]["stragglers"]
    assert (s["node"], s["rank"]) == ("algo-1", 2) and out["RuleTriggered"] == 1
    assert s["excess_s_per_step"] == pytest.approx(0.015, abs=0.002) and s["since_step"] == 0
    basis = out["Details"]["ranks"]["algo-1/2"]["basis"]
    assert basis == ("backward" if wait_in == BACKWARD else "collectives")
    assert out["Details"]["time_at_stake_s"] == pytest.approx(400 * 0.015, rel=0.15)
    assert "algo-1/2" in out["Recommendation"] and out["Details"]["title"].startswith("Rank algo-1/2 is a straggler")


def test_equal_ranks_are_silent_and_so_is_one_rank():
    assert evaluate(Straggler, whole(synchronous(RANKS).table()))["RuleTriggered"] == 0
    single = evaluate(Straggler, whole(synchronous([("algo-1", 0)]).table()))
    assert single["Status"] == "not_applicable" and "single rank" in single["Message"]


@pytest.mark.parametrize("extra_ms, fires", [(3, False), (8, True)])
def test_the_threshold_is_a_share_of_the_step(extra_ms, fires):
    """Steps of ~53 ms: 3 ms extra is under 10 %, 8 ms over it."""
    out = evaluate(Straggler, whole(synchronous(RANKS, extra_ms={("algo-1", 1): extra_ms}).table()))
    assert bool(out["RuleTriggered"]) is fires


def test_onset_midway_is_found_from_its_window():
    gen = synchronous(RANKS, n=600, extra_ms={("algo-1", 3): 20}, from_step=400)
    out = evaluate(Straggler, whole(gen.table()))
    (s,) = out["Details"]["stragglers"]
    assert s["rank"] == 3 and 300 <= s["since_step"] <= 400  # the first window that holds enough slow steps


def test_a_slow_node_is_named():
    ranks = [("algo-1", 0), ("algo-1", 1), ("algo-2", 2), ("algo-2", 3), ("algo-3", 4), ("algo-3", 5)]
    gen = synchronous(ranks, extra_ms={("algo-3", 4): 12, ("algo-3", 5): 12})
    out = evaluate(Straggler, whole(gen.table()))
    assert out["Details"]["straggling_nodes"] == ["algo-3"] and out["RuleTriggered"] == 2
    assert "node algo-3" in out["Recommendation"]


def test_chunk_invariance():
    gen = synchronous(RANKS, n=300, extra_ms={("algo-1", 1): 10}, seed=4)
    assert_chunk_invariant(Straggler, whole(gen.table()))


@pytest.mark.parametrize("ranks", [RANKS, [(f"algo-{n}", r) for n in (1, 2, 3, 4, 5) for r in range(4)]])
@pytest.mark.parametrize("numbers_per_block", [7, 100, 101])  # windows across blocks; a block of one window
def test_blocks_of_any_size_give_the_result_of_one_block(monkeypatch, ranks, numbers_per_block):
    """The result compares ranks a block of step numbers at a time (its memory bounded by BLOCK_CELLS), and
    every figure equals the one-block result exactly: excess and medians are half-µs values, so their sums do
    not depend on the blocks. Planted: one slow rank from step 250 (fires), ranks compared with the median of
    the others (4 ranks) and of all (20 ranks)."""
    import json

    from stallwatch.analyze.rules import straggler

    gen = synchronous(ranks, n=700, extra_ms={ranks[2]: 8}, from_step=250, seed=5)
    one = evaluate(Straggler, whole(gen.table()))
    assert one["RuleTriggered"] == 1 and one["Details"]["time_at_stake_s"] > 0
    monkeypatch.setattr(straggler, "BLOCK_CELLS", numbers_per_block * len(ranks))
    blocked = evaluate(Straggler, whole(gen.table()))
    assert json.dumps(blocked, sort_keys=True) == json.dumps(one, sort_keys=True)


def test_kept_step_numbers_as_runs_read_back_as_the_numbers():
    """A finished rank keeps its step numbers as runs of consecutive ones (a rank's numbers are one run when
    nothing is skipped): every slice and every lookup equals the plain sorted array's, gaps and repeats of the
    numbering included."""
    from stallwatch.analyze.rules.straggler import _runs, _Steps

    rng = np.random.default_rng(7)
    numbers = np.unique(np.r_[np.arange(0, 500), np.arange(700, 705), rng.integers(900, 5_000, 300), [10**9]])
    steps = _Steps(_runs(numbers), np.zeros(len(numbers), np.int32), None, None)
    assert len(steps.runs) < len(numbers) and np.array_equal(steps.numbers(), numbers)
    for lo, hi in ((0, 0), (0, 1), (3, 499), (499, 506), (100, len(numbers)), (len(numbers) - 1, len(numbers))):
        assert np.array_equal(steps.numbers(lo, hi), numbers[lo:hi])
    probes = np.r_[-5, numbers[::7], numbers[::11] + 1, 600, 10**9 + 3]
    assert np.array_equal(steps.locate(probes), np.searchsorted(numbers, probes))
    assert len(_runs(np.arange(100, 10_100)).tolist()) == 1
