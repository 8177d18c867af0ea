"""Batch evaluation hands the rules one node at a time and says when a node is done (`Chunk.done`): the rules
whose verdicts are per series reduce a finished node to its summary, so their state does not grow with the
number of nodes, and their results are those of one chunk."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from stallwatch.analyze.rules.base import Chunk
from stallwatch.analyze.rules.bottleneck import CPUBottleneck
from stallwatch.analyze.rules.dataloader import Dataloader
from stallwatch.analyze.rules.batch_size import BatchSize
from stallwatch.analyze.rules.gpu_memory_increase import GPUMemoryIncrease
from stallwatch.analyze.rules.low_gpu_utilization import LowGPUUtilization
from stallwatch.analyze.rules.input_bound import InputBound
from stallwatch.analyze.rules.kit.stats import Distribution, ValueCounts
from stallwatch.analyze.rules.step_outlier import StepOutlier
from stallwatch.analyze.rules.straggler import Straggler
from stallwatch.analyze.rules.system_usage import OverallSystemUsage

from ._fw_gen import MS, T0, FwGen, node_info, run_info, snapshots, split_by_time

NODES = [f"algo-{i}" for i in range(1, 5)]


def _node_chunks(node: str, info: dict, *, done: bool) -> list[Chunk]:
    """One node's data as the batch feed hands it: three slices, every node present, the last marked done.
    Planted: 1,500 steps on each of two ranks, slow steps 40 apart, waits for data, workers alive, CPU and network
    usage."""
    gen = FwGen()
    for rank in (0, 1):
        gen.dataloader(node=node, rank=rank, at_us=T0)
        gen.steps(node=node, rank=rank, n=1500, start_us=T0 + MS, seed=rank + len(node),
                  data_wait_us=np.arange(1500) % 97 * 100 + 3 * MS, slow={40 * k + 7: 400 * MS for k in range(30)})
    end = T0 + 200 * 1000 * MS
    gpus = {f"gpu{g}__{metric}": (lambda ts, g=g, k=k: (ts // MS * (g + 3) + 17 * k) % 10_000 / 100)
            for g in range(2) for k, metric in enumerate(("gpu_util", "gpu_mem_util"))}
    system = {n: snapshots(n, T0, end if n == node else T0, 1000 * MS, info["nodes"][n], proc__workers_alive=4,
                           cpu__cpu_util=lambda ts: ts // MS % 9000 / 100, net__net_rx_bps=lambda ts: ts % 100_003 * 1.5,
                           **gpus)
              for n in NODES}
    whole = Chunk(system, gen.table(), info)
    parts = split_by_time(whole, [T0 + 60 * 1000 * MS, T0 + 120 * 1000 * MS])
    for part in parts:
        part.final = False
    if done:
        parts[-1].done = frozenset((node,))
    return parts


def _feed(cls: type, nodes: list[str], *, done: bool, **params: object) -> tuple[object, dict]:
    """The rule after `nodes` (fed node by node) and its result after the final empty chunk."""
    info = run_info(*(node_info(n, end_us=T0 + 200 * 1000 * MS, cores=16) for n in NODES))
    rule = cls(**params)
    for node in nodes:
        for chunk in _node_chunks(node, info, done=done):
            rule.update(chunk)
    state = pickle.dumps(rule)
    final = split_by_time(_node_chunks(nodes[0], info, done=False)[0], [0])[0]  # no rows
    rule.update(Chunk(final.system, final.framework, info, final=True))
    return state, rule.result().to_json()


SHORT = {"patience": 10, "window": 30}  # windows of the GPU rules within a node's 200 snapshots


@pytest.mark.parametrize("cls, params", [(StepOutlier, {}), (InputBound, {}), (Dataloader, {}),
                                         (OverallSystemUsage, {}), (CPUBottleneck, {}),
                                         (LowGPUUtilization, SHORT), (BatchSize, SHORT),
                                         (GPUMemoryIncrease, {"patience": 10, "window": 7})])
def test_a_finished_node_leaves_only_its_summary(cls, params):
    state_one, _ = _feed(cls, NODES[:1], done=False, **params)  # one node in progress: its per-step data
    state_four, result = _feed(cls, NODES, done=True, **params)  # four finished nodes: their summaries
    _, unreduced = _feed(cls, NODES, done=False, **params)
    assert len(state_four) < len(state_one), (len(state_four), len(state_one))
    assert json.dumps(result, sort_keys=True) == json.dumps(unreduced, sort_keys=True)
    # CPUBottleneck: the events wait for the node's snapshots to pass patience (200 < 1000 here), so they wait
    # for the node's end
    assert result["Datapoints"] > 0 or cls is CPUBottleneck
    assert result["Status"] == "ok", result["Message"]


def test_straggler_keeps_ranks_compactly_with_the_same_result():
    """Straggler compares ranks step by step across nodes, so it keeps every step until the end: as one
    compact row per step number (no per-event arrays), with the same result."""
    state_four, result = _feed(Straggler, NODES, done=True)
    _, unreduced = _feed(Straggler, NODES, done=False)
    assert json.dumps(result, sort_keys=True) == json.dumps(unreduced, sort_keys=True)
    steps = 4 * 2 * 1500
    assert len(state_four) < steps * 40, len(state_four) / steps  # bytes per rank-step


def test_value_counts_give_the_statistics_of_every_value():
    rng = np.random.default_rng(3)
    counts, plain, everything = ValueCounts(), Distribution(None, np.float64), []
    for _ in range(40):
        values = rng.integers(0, rng.integers(1, 50_000), rng.integers(0, 4000)).astype(np.float64)
        counts.add(values)
        plain.add(values)
        everything.append(values)
    qs = (0, 25, 50, 95, 99, 100)
    assert counts.percentiles(qs) == plain.percentiles(qs) == [float(x) for x in np.percentile(np.concatenate(everything), qs)]
    (a, ea), (b, eb) = counts.histogram(50), plain.histogram(50)
    assert np.array_equal(a, b) and np.array_equal(ea, eb)
    assert counts.n == plain.n and counts.max() == plain.max() and counts.count_le(900.0) == plain.count_le(900.0)
    assert len(counts._values) <= 50_000  # distinct values, whatever the number added
