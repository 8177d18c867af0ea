"""Straggler on generated events of synchronous data-parallel training: every rank's step lasts as long as the
slowest rank's, the others wait inside backward (DDP) or inside explicit collectives. The rule names the slow
rank (and a node whose ranks all lag), stays silent on equal ranks and on one rank, and gives the same result
for one chunk or many."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze.rules.straggler import Straggler
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, STEP, TRAIN

from ._fw_gen import MS, T0, FwGen, assert_chunk_invariant, evaluate, spy_replays, whole


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


def _drop(table, keep):
    """`table` without the rows `keep` says no to."""
    import pyarrow as pa

    return pa.Table.from_pylist([r for r in table.to_pylist() if keep(r)], schema=table.schema)


@pytest.mark.parametrize("wait_in, slow, per_node, budget", [
    (BACKWARD, [("algo-2", 1)], 2, "kept"), (COLLECTIVE, [("algo-2", 1)], 2, "kept"),
    (BACKWARD, [("algo-2", 0), ("algo-2", 1)], 2, "kept"),  # 6 ranks: each compared with the median of the others
    (COLLECTIVE, [("algo-2", r) for r in range(4)], 4, "kept"),  # 20 ranks: with the median of all
    (BACKWARD, [("algo-2", 1)], 2, "node"), (COLLECTIVE, [("algo-2", 0), ("algo-2", 1)], 2, "node")])
def test_a_batch_evaluation_keeps_summaries_and_replays_the_run_with_the_result_of_memory(tmp_path, monkeypatch,
                                                                                         wait_in, slow, per_node,
                                                                                         budget):
    """Batch evaluation (node by node) keeps of a finished rank only a summary (its step numbers as runs, its
    coverage, where its events of each span of step numbers lie in time) and reads the run again, a block of step
    numbers at a time, for the verdict: the same result byte for byte as with every step held, whatever the
    blocks. Planted: a slow rank (or a slow node) from step 200 on a 3-node job; a rank without steps 100–149;
    a node whose steps come 40 s after the others' (a rank that reaches a number late, not in lockstep); a
    collective of step 300 that starts 4 s after its step; spans of 32 numbers, blocks of 2 spans or 1 (bound by
    all ranks, or by one node's). One straggler's time at stake
    comes with the verdict; several stragglers' needs a second pass (the slowest of them at each step), over
    the straggling ranks' nodes only where there are enough ranks for the median of all to be the measure.
    `budget`: the steps are let go past KEEP_BYTES of finished ranks' steps, or past NODE_BYTES of the node being
    read (then from the first chunk on, every rank keeps only its step numbers as runs and its spans)."""
    import json
    import pickle

    import pyarrow as pa

    from stallwatch.analyze.rules import straggler, straggler_excess, straggler_replay
    from stallwatch.analyze.judge.feed import iter_run, read_run
    from stallwatch.analyze.judge.runner import evaluate as run_rules
    from stallwatch.store.reader import open_run

    from ...run_builder import make_run
    from ._fw_gen import write_events

    monkeypatch.setattr(straggler_excess, "SPAN", 32)
    if budget == "kept":
        monkeypatch.setattr(straggler, "KEEP_BYTES", 0)  # the steps of the first finished rank are let go
    else:
        monkeypatch.setattr(straggler, "NODE_BYTES", 0)  # … of the first chunk read: only numbers are kept
    monkeypatch.setattr(straggler_replay, "REPLAY_CELLS", 64 * 6)
    node_cells = 32 * per_node if wait_in == COLLECTIVE else 1 << 30  # with collectives, a node's ranks bound a block
    monkeypatch.setattr(straggler_replay, "NODE_CELLS", node_cells)
    nodes = ("algo-1", "algo-2", "algo-3", "algo-4", "algo-5")[:3 if per_node == 2 else 5]
    ranks = [(n, r) for n in nodes for r in range(per_node)]
    table = synchronous(ranks, n=600, extra_ms={key: 12 + 3 * i for i, key in enumerate(slow)}, from_step=200,
                        wait_in=wait_in, seed=3).table()
    late_node = pa.compute.equal(table["node"], "algo-3")
    shift = pa.compute.if_else(late_node, 40_000_000, 0).cast(pa.int64())
    for name in ("start_us", "end_us"):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(i), pa.compute.add(table[name], shift))
    table = _drop(table, lambda r: not (r["node"] == "algo-3" and r["rank"] == 0 and 100 <= r["step"] < 150))
    late = FwGen()
    step300 = next(r for r in table.to_pylist() if r["kind"] == STEP and r["step"] == 300 and r["node"] == "algo-1")
    late.events("algo-1", 0, COLLECTIVE, "barrier", TRAIN, 300, step300["start_us"] + 4_000_000,
                step300["start_us"] + 4_000_100)
    table = pa.concat_tables([table, late.table()])
    make_run(tmp_path / "run", nodes=nodes, seconds=80)
    write_events(tmp_path / "run", table)
    run = open_run(str(tmp_path / "run"))

    memory = evaluate(Straggler, read_run(run, [Straggler]))
    assert memory["Details"]["ranks_fired"] == [f"{n}/{r}" for n, r in slow]
    assert memory["Details"]["straggling_nodes"] == (["algo-2"] if len(slow) == per_node else [])

    reads = spy_replays(monkeypatch)  # (pieces, kinds) of each reading of the run again
    chunks = list(iter_run(run, [Straggler], slice_us=5_000_000))
    rule = Straggler()
    for chunk in chunks[:-1]:
        rule.update(chunk)
        if budget == "node":
            assert all(r.runs is not None and not r.step.n for r in rule._ranks.values())
    assert not rule._ranks and not rule._done and len(rule._summaries) == len(ranks)  # summaries only
    assert rule._replaying and not len(rule._starts.numbers)
    assert len(pickle.dumps(rule._summaries)) < 1000 * len(ranks)
    assert rule._summaries[("algo-3", 0)].runs.tolist() == [[0, 100], [150, 450]]
    spans = rule._summaries[("algo-1", 0)].spans
    assert spans[:, 0].tolist() == list(range(19)) and spans[9, 2] - spans[9, 1] > 4_000_000  # step 300's span
    rule.update(chunks[-1])
    replayed = rule.result().to_json()
    assert json.dumps(replayed, sort_keys=True) == json.dumps(memory, sort_keys=True)
    assert len(reads) == (1 if len(slow) == 1 else 2)  # the verdict, then the time at stake of several stragglers
    per = max(1, min(64 * 6 // len(ranks), node_cells // per_node) // 32)  # spans per block
    assert per == (1 if wait_in == COLLECTIVE or len(ranks) > 6 else 2)
    assert len(reads[0][0]) == -(-19 // per) * len(nodes) and {n for n, _, _ in reads[0][0]} == set(nodes)
    if len(slow) > 1:
        assert {n for n, _, _ in reads[1][0]} == (set(nodes) if len(ranks) <= 16 else {"algo-2"})
    (through_runner,) = [r.to_json() for r in run_rules([Straggler], iter_run(run, [Straggler]))]
    assert json.dumps(through_runner, sort_keys=True) == json.dumps(memory, sort_keys=True)
    monkeypatch.setattr(straggler, "KEEP_BYTES", 1 << 30)  # the default's case here: the steps are kept, no replay
    monkeypatch.setattr(straggler, "NODE_BYTES", 1 << 30)
    reads.clear()
    (kept,) = [r.to_json() for r in run_rules([Straggler], iter_run(run, [Straggler]))]
    assert not reads and json.dumps(kept, sort_keys=True) == json.dumps(memory, sort_keys=True)


def test_shared_numbers_from_runs_are_those_of_two_ranks_or_more():
    from stallwatch.analyze.rules.straggler import _runs
    from stallwatch.analyze.rules.straggler_replay import _shared

    a, b, c = np.arange(0, 50), np.r_[np.arange(10, 20), np.arange(40, 70)], np.arange(65, 90)
    numbers = _shared([_runs(a), _runs(b), _runs(c), _runs(np.empty(0, np.int64))])
    expected, seen = np.unique(np.concatenate([a, b, c]), return_counts=True)
    assert numbers.tolist() == expected[seen >= 2].tolist()
    assert not len(_shared([_runs(a)])) and not len(_shared([]))


def test_numbers_kept_as_runs_merge_and_overlap_as_sets_of_numbers():
    """A rank kept as numbers only adds a chunk's numbers (any order, repeated, touching or inside earlier runs) to
    its runs, and counts the numbers two run lists share, as sets of numbers would."""
    from stallwatch.analyze.rules.straggler import _numbers_as_runs, _overlap, _union

    rng = np.random.default_rng(5)
    for _ in range(50):
        a_parts = [rng.integers(0, 3000, rng.integers(0, 400)) for _ in range(4)]
        b = rng.integers(0, 3000, rng.integers(1, 900))
        runs = np.zeros((0, 2), np.int64)
        for part in a_parts:
            runs = _union(np.concatenate([runs, _numbers_as_runs(part)]))
        a = np.unique(np.concatenate(a_parts))
        assert np.array_equal(runs, _numbers_as_runs(a))
        if len(a):
            assert _overlap(runs, _numbers_as_runs(b)) == len(np.intersect1d(a, b))


@pytest.mark.parametrize("keys, starts", [(5, 3), (10**6, 10**9), (2**40, 2**50), (2**20, 2**45)])
def test_the_replays_one_key_sort_is_lexsorts_order(keys, starts):
    """Ties of both kept in row order (a rank's first step of a number is its first row), whether the two fit in
    one int64 (the usual case) or not (the two-key sort)."""
    from stallwatch.analyze.rules.straggler_replay import _by_key_then_start

    rng = np.random.default_rng(keys % 97)
    for m in (0, 1, 2000):
        key = rng.integers(0, keys, m).astype(np.int64)
        start = rng.integers(0, starts, m).astype(np.int64) + 1_700_000_000_000_000
        assert np.array_equal(_by_key_then_start(key, start), np.lexsort((start, key)))
