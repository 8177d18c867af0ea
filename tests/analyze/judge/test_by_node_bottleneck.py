"""CPUBottleneck and IOBottleneck merged node by node give the single feed's result where the nodes' kind and mode
names come in different orders (the worker's codes are renumbered into the caller's), ranges tie across nodes, a
node is CPU-only and another has events only."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stallwatch.analyze.rules.bottleneck import CPUBottleneck, IOBottleneck
from stallwatch.analyze.judge.by_node import evaluate_by_node
from stallwatch.analyze.judge.feed import iter_run
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.records import TRAIN
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import FwGen
from tests.analyze.rules._gen import INTERVAL_US, START_US, make_node, plant_cpu_bottleneck, plant_io_bottleneck
from tests.analyze.judge.test_by_node import PicklingEngine
from tests.present.generated_run import write_run

S, MS = 1_000_000, 1_000
SLICE_US = 40 * S  # 80 snapshots a slice: bottleneck runs and events cross slice edges
PARAMS = {name: {"patience": 20, "threshold": 10} for name in ("CPUBottleneck", "IOBottleneck")}


def _at(i: int) -> int:
    return START_US + i * INTERVAL_US


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: Any) -> str:
    """algo-1: both bottlenecks, events of kinds met by no other node first ("zz_io", mode "ZZ"). algo-2: both
    bottlenecks at the same snapshots as algo-1 (ties), steps with phases, then "zz_io" events: its own table
    numbers the names otherwise than the caller's. algo-3: CPU-only, with events. algo-4: events only."""
    frames = [make_node("algo-1", 300, 4, 2, seed=1), make_node("algo-2", 300, 4, 2, seed=2),
              make_node("algo-3", 300, 4, 0, seed=3)]
    for frame in frames[:2]:
        plant_cpu_bottleneck(frame, 70, 100)
        plant_cpu_bottleneck(frame, 150, 170, gpu=1, core=2)
        plant_io_bottleneck(frame, 110, 140, gpu=1, core=1)
        plant_io_bottleneck(frame, 290, 300)  # lasts to the node's end
    gen = FwGen()
    gen.events("algo-1", 0, "zz_io", "read", "ZZ", None, [_at(60 + 10 * k) for k in range(12)],
               [_at(66 + 10 * k) for k in range(12)])
    gen.events("algo-1", 1, "zz_io", "read", "ZZ", None, _at(285), _at(320))  # ends after the last snapshot
    gen.steps(node="algo-2", rank=0, n=1200, start_us=_at(10), step_us=100 * MS)
    gen.steps(node="algo-2", rank=1, mode="EVAL", n=600, start_us=_at(10), step_us=200 * MS)
    gen.events("algo-2", 0, "zz_io", "read", TRAIN, None, [_at(65 + 10 * k) for k in range(12)],
               [_at(72 + 10 * k) for k in range(12)])
    gen.steps(node="algo-3", rank=0, n=300, start_us=_at(10))
    gen.steps(node="algo-4", rank=0, n=300, start_us=_at(10))
    return str(write_run(tmp_path_factory.mktemp("by_node_bottleneck") / "run", frames, gen.table()))


@pytest.mark.parametrize("cls", [CPUBottleneck, IOBottleneck], ids=lambda c: c.name)
def test_merged_nodes_give_the_single_feeds_result(run_dir, cls):
    run = open_run(run_dir)
    one = evaluate([cls], iter_run(run, [cls], slice_us=SLICE_US), PARAMS)[0]
    spread = evaluate_by_node(run, [cls], PARAMS, engine=PicklingEngine(), slice_us=SLICE_US)[0]
    text = json.dumps(one.to_json(), sort_keys=True, default=str)
    assert json.dumps(spread.to_json(), sort_keys=True, default=str) == text
    context = one.details["framework_context"]
    assert one.triggered and set(context) == {"algo-1", "algo-2"}
    assert "zz_io" in context["algo-1"]["kinds_s"] and "zz_io" in context["algo-2"]["kinds_s"]
    assert context["algo-2"]["phases_s"]
    assert set(one.details["not_applicable"]) == {"algo-3", "algo-4"}
