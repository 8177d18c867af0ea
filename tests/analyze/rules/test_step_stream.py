"""StepOutlier on a long node (analyze/rules/step_stream.py): past NODE_BYTES of steps held, a node's series keep
only sums, bucket counts, their largest durations and where each span of step numbers lies in time, and the node
is read again a block of step numbers at a time once it is complete — with the result of every step held in
memory, byte for byte."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from stallwatch.analyze.rules import step_stream
from stallwatch.analyze.judge.feed import iter_run, read_run
from stallwatch.analyze.judge.runner import evaluate as run_rules
from stallwatch.analyze.rules.step_outlier import StepOutlier
from stallwatch.records import COLLECTIVE, EVAL, TRAIN
from stallwatch.store.reader import open_run

from ...run_builder import make_run
from ._fw_gen import MS, T0, FwGen, S, evaluate, spy_replays, write_events


def _run(tmp_path):
    """Two nodes with what makes a series hard to add up block by block: outliers (some with a late collective
    of their step, 4 s after it), TRAIN and EVAL numbered alike, a loop that starts its numbering again, steps
    without a number, numbers 2^30 apart, and 120 equally slow steps (more than are listed, more than the largest
    durations a series keeps in the test), and slow steps excused by their peers' wait for a CPU."""
    gen = FwGen()
    slow = {7 + 37 * i: 400 * MS for i in range(15)}
    gen.steps(node="algo-1", rank=0, n=600, slow=slow, seed=1)
    gen.steps(node="algo-1", rank=0, mode=EVAL, n=100, start_us=T0 + 70 * S, seed=2, slow={50: 900 * MS})
    gen.events("algo-1", 0, COLLECTIVE, "all_reduce", TRAIN, 303, T0 + 35 * S, T0 + 35 * S + 80 * MS)
    gen.steps(node="algo-1", rank=1, n=2400, slow={5 + 20 * i: 300 * MS for i in range(120)}, jitter_us=0, seed=3)
    gen.steps(node="algo-1", rank=1, n=100, first_step=100, start_us=T0 + 300 * S, slow={150: 2 * S}, seed=4)
    gen.steps(node="algo-2", rank=0, n=500, slow={i: 150 * MS + i for i in range(0, 500, 25)}, seed=5)
    gen.steps(node="algo-2", rank=0, n=40, first_step=1 << 30, start_us=T0 + 80 * S, seed=6)
    table = gen.table()
    numbers = table["step"].to_numpy(zero_copy_only=False).copy()
    on_two = np.flatnonzero(pa.compute.equal(table["node"], "algo-2").to_numpy(zero_copy_only=False))
    numbers[on_two[:12]] = -1  # the first events of algo-2 carry no step number
    table = table.set_column(table.schema.get_field_index("step"), "step", pa.array(numbers, pa.int64()))
    # Some steps' native peers waited for a CPU: one in six slow steps of algo-1's rank 1 only that long (excused),
    # and every third step of algo-2, unnumbered ones included (held back with their durations)
    args = table["args"].to_pylist()
    kinds, nodes, ranks = (table[c].to_pylist() for c in ("kind", "node", "rank"))
    for i, (kind, node, rank, number) in enumerate(zip(kinds, nodes, ranks, numbers.tolist())):
        if kind == "step" and node == "algo-1" and rank == 1 and number < 2400 and (number - 5) % 120 == 0:
            args[i] = '{"peer_runq_us": 250000}'
        elif kind == "step" and node == "algo-2" and i % 3 == 0:
            args[i] = '{"peer_runq_us": 120000}'
    table = table.set_column(table.schema.get_field_index("args"), "args", pa.array(args, table["args"].type))
    make_run(tmp_path / "run", nodes=("algo-1", "algo-2"), seconds=320)
    write_events(tmp_path / "run", table)
    return open_run(str(tmp_path / "run"))


@pytest.mark.parametrize("top, block_steps, span", [(8, 64, 16), (1 << 16, 1 << 17, 1024)])
def test_a_long_node_read_again_gives_the_result_of_every_step_held(tmp_path, monkeypatch, top, block_steps, span):
    run = _run(tmp_path)
    memory = evaluate(StepOutlier, read_run(run, [StepOutlier]))
    fired = {k for k, e in memory["Details"]["step_details"].items() if e["triggered"]}
    assert {"algo-1/0/TRAIN", "algo-1/1/TRAIN"} <= fired
    assert memory["Details"]["step_details"]["algo-1/1/TRAIN"]["outliers_listed"] == 100
    assert memory["Details"]["step_details"]["algo-1/1/TRAIN"]["outliers_waiting_for_cpu"] == 20
    assert memory["Details"]["step_details"]["algo-2/0/TRAIN"]["outliers_waiting_for_cpu"] > 0

    monkeypatch.setattr(step_stream, "NODE_BYTES", 0)  # every node streamed from its first chunk
    monkeypatch.setattr(step_stream, "TOP", top)  # 8: the largest normal step is found by a second read
    monkeypatch.setattr(step_stream, "BLOCK_STEPS", block_steps)
    monkeypatch.setattr(step_stream, "SPAN", span)
    reads = spy_replays(monkeypatch)
    chunks = list(iter_run(run, [StepOutlier], slice_us=5 * S))
    rule = StepOutlier()
    for chunk in chunks[:-1]:
        if "algo-1" in chunk.done:  # algo-1's last chunk: up to here it was only streamed
            assert not [k for k in rule._series if k[0] == "algo-1"]
            assert {k for k in rule._streamed if k[0] == "algo-1"} == {("algo-1", 0, TRAIN), ("algo-1", 0, EVAL),
                                                                      ("algo-1", 1, TRAIN)}
            assert all(len(s.top) <= max(2 * top, 700) for s in rule._streamed.values())
        rule.update(chunk)
    assert not rule._series and not rule._streamed and not rule._spans  # judged: only verdicts are left
    rule.update(chunks[-1])
    streamed = rule.result().to_json()
    assert json.dumps(streamed, sort_keys=True) == json.dumps(memory, sort_keys=True)
    assert {pieces[0][0] for pieces, _ in reads} == {"algo-1", "algo-2"}
    second = [kinds for _, kinds in reads if kinds is not None]
    assert bool(second) == (top == 8)  # more outliers than kept largest durations: steps read once more
    if block_steps == 64:
        assert max(len(pieces) for pieces, _ in reads) > 3  # blocks of a few spans each

    (through_runner,) = [r.to_json() for r in run_rules([StepOutlier], iter_run(run, [StepOutlier]))]
    assert json.dumps(through_runner, sort_keys=True) == json.dumps(memory, sort_keys=True)
    # The default: algo-1 is held in memory; algo-2's context tables, one row per step number from its first
    # number, span 4 M numbers (150 MB for 540 steps), so it is streamed and read again.
    monkeypatch.setattr(step_stream, "NODE_BYTES", 64 << 20)
    reads.clear()
    (held,) = [r.to_json() for r in run_rules([StepOutlier], iter_run(run, [StepOutlier]))]
    assert {pieces[0][0] for pieces, _ in reads} == {"algo-2"}
    assert json.dumps(held, sort_keys=True) == json.dumps(memory, sort_keys=True)


def test_buckets_are_monotone_and_exact_for_short_durations():
    """A larger duration never falls in a lower bucket; each µs has its own below 512 µs, and a bucket is at most
    0.4 % wide above."""
    values = np.r_[-(1 << 40), -1000, -1, 0, 1, 2, 511, 512, 513, 1 << 20, (1 << 20) + 1, 1 << 45, (1 << 53) - 1]
    buckets = step_stream.bucket_of(values)
    assert np.all(np.diff(buckets) >= 0)
    small = np.arange(0, 512)
    assert len(np.unique(step_stream.bucket_of(small))) == 512  # one bucket per µs below 512 µs
    rng = np.random.default_rng(0)
    wide = np.sort(rng.integers(0, 1 << 40, 100_000))
    assert np.all(np.diff(step_stream.bucket_of(wide)) >= 0)
    b = step_stream.bucket_of(wide)
    heads = np.r_[0, np.flatnonzero(np.diff(b)) + 1]
    lo, hi = wide[heads], np.maximum.reduceat(wide, heads)
    assert np.all(hi - lo <= lo >> 8)  # a bucket is at most 1/256 of its values wide
