"""The GPU rules fed node by node and merged (test_by_node.py) on a run with the cases its fixture lacks: a CPU-only
node, a node shorter than patience, nodes that overlap in time and flag the same windows (ties in the flagged
windows' order), windows that do not divide a node and cross slices; and a node fed to both sides refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stallwatch.analyze.judge.by_node import evaluate_by_node
from stallwatch.analyze.judge.feed import iter_run
from stallwatch.analyze.rules.batch_size import BatchSize
from stallwatch.analyze.rules.gpu_memory_increase import GPUMemoryIncrease
from stallwatch.analyze.rules.load_balancing import LoadBalancing
from stallwatch.analyze.rules.low_gpu_utilization import LowGPUUtilization
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.store.reader import open_run
from tests.analyze.rules._gen import (
    START_US,
    chunk,
    make_node,
    plant_fluctuation,
    plant_gpu_util,
    plant_memory_step,
    plant_small_batch,
)
from tests.analyze.judge.test_by_node import PicklingEngine, _text
from tests.present.generated_run import write_run

S = 1_000_000
RULES = [LowGPUUtilization, BatchSize, GPUMemoryIncrease, LoadBalancing]
PARAMS = {cls.name: {"patience": 50, **({"window": 70 if cls is not GPUMemoryIncrease else 10}
                                        if "window" in cls.defaults else {})} for cls in RULES}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: Any) -> str:
    """a and d: the same start, the same planted fluctuation (tied flagged windows), d with three GPUs and longer;
    b: CPU only; c: one GPU, 40 snapshots (inside patience), starting while a still records."""
    a, d = make_node("a", 330, 2, 2, seed=1), make_node("d", 500, 2, 3, seed=4)
    for frame in (a, d):
        plant_fluctuation(frame, 1, 120, 260)
        plant_memory_step(frame, 0, 200, 20)
        plant_small_batch(frame, 270, 330)
    plant_gpu_util(d, 2, 0, 500, 3.0)
    frames = [a, make_node("b", 300, 2, 0, seed=2), make_node("c", 40, 2, 1, seed=3, start_us=START_US + 100 * S), d]
    return str(write_run(tmp_path_factory.mktemp("by_node_gpu") / "run", frames))


@pytest.mark.parametrize("cls", RULES, ids=[c.name for c in RULES])
def test_merged_by_node_equals_the_single_feed_on_edge_nodes(run_dir, cls):
    run = open_run(run_dir)
    one = _text(evaluate([cls], iter_run(run, [cls], slice_us=37 * S), PARAMS))
    spread = _text(evaluate_by_node(run, [cls], PARAMS, engine=PicklingEngine(), slice_us=37 * S))
    assert spread == one
    assert json.loads(one[0])["RuleTriggered"] > 0  # the planted patterns fire


@pytest.mark.parametrize("cls", RULES, ids=[c.name for c in RULES])
def test_a_node_fed_to_both_sides_is_refused(cls):
    """Windows and patience count from a node's first snapshot: they cannot be joined, so merge says so."""
    frame = make_node("a", 120, 2, 2, seed=5)
    mine, theirs = cls(**PARAMS[cls.name]), cls(**PARAMS[cls.name])
    mine.update(chunk(frame, final=False))
    theirs.update(chunk(frame, final=False))
    with pytest.raises(ValueError, match="fed to both"):
        mine.merge(theirs, "a")
