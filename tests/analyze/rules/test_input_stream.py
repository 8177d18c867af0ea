"""InputBound on a long node (analyze/rules/input_stream.py): past NODE_BYTES of steps held, a node's ranks keep only
a step count, duration buckets and where each span of step numbers lies in time, and the node is read again twice,
a block of step numbers at a time, in step order — with the entries of every step held in memory, byte for byte."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stallwatch.analyze.rules import input_stream, step_stream
from stallwatch.analyze.judge.feed import iter_run, read_run
from stallwatch.analyze.rules.input_bound import InputBound
from stallwatch.analyze.judge.runner import evaluate as run_rules
from stallwatch.records import DATA_WAIT, EVAL, STEP, TRAIN, MetricKey
from stallwatch.store import layout
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run
from stallwatch.store.system_writer import SystemWriter

from ...run_builder import make_run, node_record, run_record, write_node_json
from ._fw_gen import MS, T0, FwGen, S, evaluate, spy_replays, write_events

STALLS = [100 + 75 * i for i in range(12)]


def _run(tmp_path):
    """What a block-by-block reading must get right: isolated stalls of 2 s among 1 ms waits (named; their
    threshold ten times the median wait), a starved rank with random waits, the windows that straddle blocks, a
    wait recorded 3 s after its step (another piece), a loop that numbers its steps again from 100, an EVAL-only
    rank, a rank that records four waits a step, and a rank of a second node too short to judge."""
    gen = FwGen()
    waits = np.full(1000, 1 * MS)
    waits[STALLS] = 2 * S
    gen.steps(node="algo-1", rank=0, n=1000, data_wait_us=waits, slow={n: 2100 * MS for n in STALLS}, jitter_us=0,
              seed=1)
    gen.dataloader(node="algo-1", rank=0, num_workers=4)
    rng = np.random.default_rng(3)
    gen.steps(node="algo-1", rank=1, n=700, data_wait_us=rng.integers(0, 60 * MS, 700), seed=2)
    gen.steps(node="algo-1", rank=1, n=80, first_step=100, start_us=T0 + 120 * S, seed=3)
    gen.events("algo-1", 1, DATA_WAIT, "next_batch", TRAIN, 350, T0 + 40 * S, T0 + 40 * S + 30 * MS)
    gen.steps(node="algo-1", rank=2, mode=EVAL, n=300, data_wait_us=50 * MS, jitter_us=0, seed=4)
    starts, _ = gen.steps(node="algo-1", rank=3, n=400, data_wait_us=20 * MS, jitter_us=0, seed=6)
    for part in range(1, 4):  # three more waits a step: a step waits 4 × what one recorded wait says
        gen.events("algo-1", 3, DATA_WAIT, "next_batch", TRAIN, np.arange(400), starts + 20 * MS * part,
                   starts + 20 * MS * (part + 1))
    gen.steps(node="algo-2", rank=0, n=25, data_wait_us=60 * MS, jitter_us=0, seed=5)
    make_run(tmp_path / "run", nodes=("algo-1", "algo-2"), seconds=240)
    write_events(tmp_path / "run", gen.table())
    return open_run(str(tmp_path / "run"))


@pytest.mark.parametrize("block_steps, span", [(64, 16), (1 << 17, 1024)])
def test_a_long_node_read_again_gives_the_entries_of_every_step_held(tmp_path, monkeypatch, block_steps, span):
    run = _run(tmp_path)
    memory = evaluate(InputBound, read_run(run, [InputBound]))
    ranks = memory["Details"]["ranks"]
    assert ranks["algo-1/0/TRAIN"]["cause"] == "stalls" and ranks["algo-1/0/TRAIN"]["stall_steps"] == STALLS
    assert ranks["algo-1/1/TRAIN"]["triggered"] and ranks["algo-1/2/EVAL"]["triggered"]
    assert not ranks["algo-2/0/TRAIN"]["triggered"]

    monkeypatch.setattr(step_stream, "NODE_BYTES", 0)  # every rank streamed from its node's first chunk
    monkeypatch.setattr(step_stream, "BLOCK_STEPS", block_steps)
    monkeypatch.setattr(step_stream, "SPAN", span)
    reads = spy_replays(monkeypatch)
    settled = []
    settle = input_stream._Scan.settle

    def spied(self):
        settled.append((self.s.n, settle(self)))
        return settled[-1][1]

    monkeypatch.setattr(input_stream._Scan, "settle", spied)
    chunks = list(iter_run(run, [InputBound], slice_us=5 * S))
    rule = InputBound()
    for chunk in chunks[:-1]:
        if "algo-1" in chunk.done:  # up to algo-1's last chunk, its ranks were only counted
            assert not [k for k in rule._ranks if k[0] == "algo-1"]
            assert all(isinstance(s, input_stream.StreamedRank) for s in rule._streamed.values())
        rule.update(chunk)
    assert not rule._ranks and not rule._streamed and not rule._spans
    rule.update(chunks[-1])
    streamed = rule.result().to_json()
    assert json.dumps(streamed, sort_keys=True) == json.dumps(memory, sort_keys=True)
    # algo-1 is read again once per phase (TRAIN, EVAL), and TRAIN once more for ranks 3 and 1, whose settled waits
    # (four recorded waits a step; a restarted loop's waits summed into the first loop's steps) put the median wait
    # away from where their recorded waits said
    assert len([pieces for pieces, _ in reads if pieces[0][0] == "algo-1"]) == 3
    assert sorted(settled)[-4:] == [(300, False), (400, True), (780, True), (1000, False)]
    if block_steps == 64:
        assert max(len(pieces) for pieces, _ in reads) > 3

    (through_runner,) = [r.to_json() for r in run_rules([InputBound], iter_run(run, [InputBound]))]
    assert json.dumps(through_runner, sort_keys=True) == json.dumps(memory, sort_keys=True)
    monkeypatch.setattr(step_stream, "NODE_BYTES", 64 << 20)  # the default: held in memory, nothing read again
    reads.clear()
    (held,) = [r.to_json() for r in run_rules([InputBound], iter_run(run, [InputBound]))]
    assert not reads and json.dumps(held, sort_keys=True) == json.dumps(memory, sort_keys=True)


def test_bucket_bounds_hold_their_values():
    values = np.r_[0, 1, 2, 3, 511, 512, 513, 1000, 1001, 65_537, 10**9, 10**12 + 7]
    for v, b in zip(values.tolist(), input_stream.bucket_of(values).tolist()):
        lo, hi = input_stream.bucket_bounds(b)
        assert lo <= v < hi


def test_gathered_waits_are_held_as_distinct_values_however_many_steps_fall_in_their_bucket():
    """A node-day of equal waits puts every step in the median's bucket: the gathered values stay one per µs value."""
    gather = input_stream._Gather(input_stream.bucket_of(np.array([1000, 1003], np.int64)))
    for _ in range(40):
        gather.add(np.r_[np.full(50_000, 1000), np.full(50_000, 1003), np.arange(5000, 6000)].astype(np.int64))
    values, counts = gather.distinct()
    assert values.tolist() == [1000, 1003] and counts.tolist() == [2_000_000, 2_000_000]
    assert gather.above(1000.5) == (2_000_000, 2_006_000_000)


def _busy_run(tmp_path):
    """Two ranks on a busy machine (each step's `runq_us`, and `wait_runq_us` measured in its opening wait): rank 0's
    30 fetches were preempted for 50 ms (a wait for a CPU, not for data: not input-bound once discounted; 24 % of
    its time waiting without), rank 1 sleeps 300 ms in 12 reads while its compute is preempted (stalls either way)."""
    gen = FwGen()
    preempted = set(range(60, 600, 18))
    stalled = [100 + 40 * i for i in range(12)]
    for rank in (0, 1):
        t = T0
        for i in range(600):
            if rank == 0:
                wait, runq, in_wait = (50_500, 50_000, 50_000) if i in preempted else (500, 0, 0)
            else:
                wait, runq, in_wait = (300 * MS if i in stalled else 500), 4 * MS, 0
            dur = wait + 10 * MS
            args = json.dumps({"runq_us": runq, "wait_runq_us": in_wait, "rss_kb": 1000})
            gen.events("algo-1", rank, STEP, "train_step", TRAIN, i, t, t + dur, args)
            gen.events("algo-1", rank, DATA_WAIT, "next_batch", TRAIN, i, t, t + wait)
            t += dur + 100
    make_run(tmp_path / "run", nodes=("algo-1",), seconds=240)
    write_events(tmp_path / "run", gen.table())
    return open_run(str(tmp_path / "run")), stalled


def test_a_long_node_is_judged_on_the_steps_own_time_like_one_held(tmp_path, monkeypatch):
    """The run-queue delay is taken out the same way streamed as held: the same entries byte for byte, the
    preempted fetches no data wait, the slept reads still stalls."""
    run, stalled = _busy_run(tmp_path)
    memory = evaluate(InputBound, read_run(run, [InputBound]))
    ranks = memory["Details"]["ranks"]
    assert not ranks["algo-1/0/TRAIN"]["triggered"], ranks["algo-1/0/TRAIN"]
    assert ranks["algo-1/1/TRAIN"]["cause"] == "stalls" and ranks["algo-1/1/TRAIN"]["stall_steps"] == stalled
    monkeypatch.setattr(step_stream, "NODE_BYTES", 0)  # every rank streamed from its node's first chunk
    monkeypatch.setattr(step_stream, "BLOCK_STEPS", 64)
    monkeypatch.setattr(step_stream, "SPAN", 16)
    reads = spy_replays(monkeypatch)
    (streamed,) = [r.to_json() for r in run_rules([InputBound], iter_run(run, [InputBound], slice_us=5 * S))]
    assert reads  # it was read again, block by block
    assert json.dumps(streamed, sort_keys=True) == json.dumps(memory, sort_keys=True)


def test_a_long_node_takes_out_the_workers_wait_for_a_cpu_like_one_held(tmp_path, monkeypatch):
    """A loader's workers kept from a CPU by other processes (their delay in the node's snapshots, changing every
    second): read again block by block, the waits lose what they lose held in memory, byte for byte."""
    gen = FwGen()
    for i in range(1200):
        t = T0 + i * 20 * MS
        wait = 6 * MS if i % 50 else 60 * MS
        gen.events("algo-1", 0, STEP, "train_step", TRAIN, i, t, t + 20 * MS + wait)
        gen.events("algo-1", 0, DATA_WAIT, "next_batch", TRAIN, i, t, t + wait)
    gen.dataloader(num_workers=2)
    keys = [MetricKey("cpu", "cpu_util"), MetricKey("proc", "cpu_util"), MetricKey("proc", "workers_alive"),
            MetricKey("proc", "workers_runq_ms_per_s")]
    location = RunLocation(str(tmp_path / "run"))
    location.write_atomic(layout.RUN_JSON, json.dumps(run_record("run", "algo-1", T0)).encode())
    writer = SystemWriter(location, "algo-1", keys, interval_us=S, flush_interval_us=2 * S, max_bytes=1 << 30,
                          segment_us=10 * S)
    for i in range(60):
        writer.append(T0 + i * S, [100.0, 40.0, 2.0, 500.0 if i % 2 else 100.0])
        writer.tick(T0 + i * S)
    writer.close()
    write_node_json(location, node_record("algo-1", T0, T0 + 60 * S, samples=60))
    write_events(tmp_path / "run", gen.table())
    run = open_run(str(tmp_path / "run"))
    memory = evaluate(InputBound, read_run(run, [InputBound]))
    entry = memory["Details"]["ranks"]["algo-1/0/TRAIN"]
    assert 0 < entry["wait_s"] < 0.9 * (1176 * 6 + 24 * 60) / 1000, entry  # some of the waiting was the workers'
    monkeypatch.setattr(step_stream, "NODE_BYTES", 0)
    monkeypatch.setattr(step_stream, "BLOCK_STEPS", 64)
    monkeypatch.setattr(step_stream, "SPAN", 16)
    reads = spy_replays(monkeypatch)
    (streamed,) = [r.to_json() for r in run_rules([InputBound], iter_run(run, [InputBound], slice_us=5 * S))]
    assert reads
    assert json.dumps(streamed, sort_keys=True) == json.dumps(memory, sort_keys=True)
