"""Rules fed node by node (each node's slices to fresh rules, as an engine's worker does, sent back pickled) and
merged in the feed's order give the single-process feed's results, byte for byte, for every built-in rule; here on
the local engine, with a LocalCluster in tests/analyze/test_engine.py."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from stallwatch.analyze.engine import LocalEngine
from stallwatch.analyze.rules import step_stream, straggler
from stallwatch.analyze.rules.base import Rule
from stallwatch.analyze.judge.by_node import evaluate_by_node, evaluate_run
from stallwatch.analyze.judge.feed import iter_run
from stallwatch.analyze.rules.input_bound import InputBound
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.analyze.rules.step_outlier import StepOutlier
from stallwatch.analyze.rules.straggler import Straggler
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import FwGen
from tests.analyze.rules._gen import (
    START_US,
    make_node,
    plant_cpu_bottleneck,
    plant_fluctuation,
    plant_gpu_util,
    plant_io_bottleneck,
    plant_memory_step,
    plant_small_batch,
)
from tests.present.generated_run import write_run

S, MS = 1_000_000, 1_000
SLICE_US = 110 * S  # each node in six slices: steps, windows and waits cross slice edges


class PicklingEngine(LocalEngine):
    """The local engine, with each result pickled and read back as a worker's would be."""

    def map(self, fn: Any, items: Any) -> Any:
        for result in super().map(fn, items):
            yield pickle.loads(pickle.dumps(result))


def _steps(gen: FwGen, node: str, rank: int, *, step_us: int = 100 * MS, wait_us: int = 5 * MS,
           slow: dict[int, int] | None = None) -> None:
    t = START_US + 60 * S
    gen.dataloader(node=node, rank=rank, at_us=t - S)
    _, e = gen.steps(node=node, rank=rank, n=2000, start_us=t, step_us=step_us, data_wait_us=wait_us,
                     slow=slow, seed=rank + 7 * len(node))
    _, e = gen.steps(node=node, rank=rank, mode="EVAL", n=200, start_us=int(e[-1]) + 5 * S, step_us=50 * MS,
                     seed=rank)
    gen.steps(node=node, rank=rank, n=1500, first_step=2000, start_us=int(e[-1]) + 5 * S, step_us=step_us,
              data_wait_us=wait_us, seed=rank + 1)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: Any) -> str:
    """Four nodes. algo-1: a CPU bottleneck, a fluctuating GPU, a GPU memory step, slow steps on rank 0. algo-2: an
    I/O bottleneck, a small batch, an idle GPU, a straggling rank. algo-3: one GPU, input bound (waits 70 % of
    each step). algo-4: framework events only, no snapshots."""
    frames = [make_node("algo-1", 1200, 4, 2, seed=1), make_node("algo-2", 1200, 4, 2, seed=2),
              make_node("algo-3", 1200, 4, 1, seed=3)]
    plant_cpu_bottleneck(frames[0], 100, 300)
    plant_fluctuation(frames[0], 1, 400, 700)
    plant_memory_step(frames[0], 0, 600, 20)
    plant_io_bottleneck(frames[1], 200, 400)
    plant_small_batch(frames[1], 700, 1000)
    plant_gpu_util(frames[1], 1, 0, 1200, 3.0)
    gen = FwGen()
    for rank in (0, 1):
        _steps(gen, "algo-1", rank, slow={40 * k + 9: 900 * MS for k in range(40)} if rank == 0 else None)
        _steps(gen, "algo-2", rank, step_us=100 * MS if rank == 0 else 135 * MS)
        _steps(gen, "algo-3", rank, wait_us=70 * MS)
    _steps(gen, "algo-4", 0)
    return str(write_run(tmp_path_factory.mktemp("by_node") / "run", frames, gen.table()))


def _text(results: list[Any]) -> list[str]:
    return [json.dumps(r.to_json(), sort_keys=True, default=str) for r in results]


def _both(run_dir: str, classes: list[type[Rule]]) -> tuple[list[str], list[str]]:
    run, params = open_run(run_dir), PARAMS
    one = evaluate(classes, iter_run(run, classes, slice_us=SLICE_US), params)
    spread = evaluate_by_node(run, classes, params, engine=PicklingEngine(), slice_us=SLICE_US)
    return _text(one), _text(spread)


RULES = builtin_rules()
# Within a node's 1,200 snapshots: the rules start judging after 50 (default 1,000), windows of 100.
PARAMS = {cls.name: {k: v for k, v in (("patience", 50), ("window", 100 if cls.name != "GPUMemoryIncrease" else 10),
                                       ("threshold", 10 if "Bottleneck" in cls.name else None))
                      if k in cls.defaults and v is not None}
          for cls in RULES if "patience" in cls.defaults}


@pytest.mark.parametrize("cls", RULES, ids=[c.name for c in RULES])
def test_a_rule_fed_node_by_node_and_merged_gives_the_single_feeds_result(run_dir, cls):
    assert cls.merges(), f"{cls.name} does not implement merge: it would be fed in the caller"
    one, spread = _both(run_dir, [cls])
    assert spread == one


# What the planted run makes the rules say, so that the equality above is not between two empty results.
FIRES = {"CPUBottleneck", "IOBottleneck", "Dataloader", "InputBound", "GPUMemoryIncrease", "BatchSize",
         "LowGPUUtilization", "LoadBalancing", "StepOutlier", "Straggler"}


def test_the_planted_run_makes_the_rules_fire(run_dir):
    run = open_run(run_dir)
    results = evaluate(RULES, iter_run(run, RULES, slice_us=SLICE_US), PARAMS)
    fired = {r.name for r in results if r.triggered}
    assert FIRES <= fired, sorted(FIRES - fired)


@pytest.mark.parametrize("cls", [Straggler, StepOutlier, InputBound], ids=lambda c: c.name)
def test_long_nodes_streamed_on_the_worker_merge_to_the_same_result(run_dir, cls, monkeypatch):
    """A node past its rule's memory budget is read again on the worker (`Chunk.replay` there)."""
    monkeypatch.setattr(step_stream, "NODE_BYTES", 20_000)
    monkeypatch.setattr(straggler, "NODE_BYTES", 20_000)
    one, spread = _both(run_dir, [cls])
    assert spread == one


def test_rules_that_do_not_merge_are_fed_in_the_caller(run_dir):
    """A custom rule without `merge` beside the built-ins: evaluate_run feeds it the slices, the others by node."""

    class Counting(Rule):
        name = "Counting"

        def __init__(self, **params: Any) -> None:
            super().__init__(**params)
            self.rows = 0

        def update(self, chunk: Any) -> None:
            self.rows += chunk.framework.num_rows

        def result(self) -> Any:
            return self.make_result(triggered=0, violations=0, datapoints=self.rows, details={})

    run = open_run(run_dir)
    classes = [*RULES[:3], Counting]
    local = evaluate(classes, iter_run(run, classes, slice_us=SLICE_US))
    engine = PicklingEngine()
    engine.name = "pickling"  # anything but "local": the rules that merge go by node
    spread = evaluate_run(run, classes, engine=engine, slice_us=SLICE_US)
    assert _text(spread) == _text(local)
    assert spread[-1].datapoints == run.framework().num_rows > 0


def test_a_rule_that_fails_on_a_worker_reports_its_error_and_the_others_their_results(run_dir, monkeypatch):
    from stallwatch.analyze.rules.max_initialization_time import MaxInitializationTime
    from stallwatch.analyze.rules.system_usage import OverallSystemUsage

    def broken(self: Any, chunk: Any) -> None:
        raise RuntimeError("planted")

    run = open_run(run_dir)
    classes = [MaxInitializationTime, OverallSystemUsage]
    monkeypatch.setattr(OverallSystemUsage, "update", broken)
    results = evaluate_by_node(run, classes, engine=PicklingEngine(), slice_us=SLICE_US)
    assert results[1].status == "error" and "planted" in results[1].message
    assert results[0].status != "error"
