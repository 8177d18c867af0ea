"""InputBound fed node by node and merged (`by_node`) gives the single feed's result on runs the planted run of
test_by_node.py does not cover: a node with no steps, a rank whose waits are not recorded (Keras on TensorFlow),
a Keras loader whose training facts come after its evaluation's, a rank on one node only with no TRAIN steps,
nodes whose steps overlap in time, and ranks on two nodes that tie."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from stallwatch.analyze.rules import step_stream
from stallwatch.analyze.rules.base import Chunk
from stallwatch.analyze.judge.by_node import evaluate_by_node, node_task
from stallwatch.analyze.judge.feed import iter_run, plan
from stallwatch.analyze.rules.input_bound import InputBound
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.records import STEP
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import T0, FwGen, node_info, run_info, split_by_time
from tests.analyze.rules._gen import START_US, make_node
from tests.analyze.judge.test_by_node import MS, PicklingEngine, S, _text
from tests.analyze.rules.test_node_state import NODES, _node_chunks
from tests.present.generated_run import write_run

SLICE_US = 20 * S  # each node's 40 s of steps in several slices
PARAMS = {"InputBound": {"patience": 10, "window": 50}}
T = START_US + 10 * S


def _keras(gen: FwGen, node: str, rank: int, at_us: int, **facts: Any) -> None:
    gen.events(node, rank, "dataloader", "PyDataset", "GLOBAL", None, at_us, at_us,
               json.dumps({"framework": "keras", "input": "py_dataset", **facts}))


def _unmeasured(gen: FwGen, node: str, rank: int) -> None:
    """A rank whose `loop` marker says its steps record no wait for data, and steps without one."""
    gen.events(node, rank, "loop", "fit", "GLOBAL", None, T - S, T - S, json.dumps({"phases": [STEP]}))
    gen.steps(node=node, rank=rank, n=300, start_us=T, phases=False, seed=rank)


def _mixed() -> FwGen:
    gen = FwGen()
    # algo-1: a Keras rank that waits, its evaluation loader first; a rank whose waits are not recorded
    _keras(gen, "algo-1", 0, T - 2 * S, loop="evaluate", worker_threads=0)
    _keras(gen, "algo-1", 0, T - S, loop="train", worker_threads=2)
    gen.steps(node="algo-1", rank=0, n=400, start_us=T, data_wait_us=60 * MS, seed=1)
    _unmeasured(gen, "algo-1", 1)
    # algo-2: a loader and no steps
    gen.dataloader(node="algo-2", rank=0, at_us=T, num_workers=0)
    # algo-3: EVAL steps only, on a rank no other node has, while algo-1 trains; algo-4: the same numbers in TRAIN
    gen.dataloader(node="algo-3", rank=7, at_us=T, num_workers=0)
    gen.steps(node="algo-3", rank=7, mode="EVAL", n=400, start_us=T + 5 * S, data_wait_us=40 * MS, seed=3)
    for workers in (1, 2):
        gen.dataloader(node="algo-4", rank=0, at_us=T + workers, num_workers=workers)
    gen.steps(node="algo-4", rank=0, n=400, start_us=T + 5 * S, data_wait_us=40 * MS, seed=3)
    return gen


def _all_unmeasured() -> FwGen:
    gen = FwGen()
    for node in ("algo-1", "algo-2"):
        _unmeasured(gen, node, 0)
    return gen


def _result(tmp_path: Any, gen: FwGen) -> tuple[list[str], list[str]]:
    root = write_run(tmp_path / "run", [make_node("algo-1", 200, 8, 0, seed=1)], gen.table())
    run, classes = open_run(str(root)), [InputBound]
    one = evaluate(classes, iter_run(run, classes, slice_us=SLICE_US), PARAMS)
    spread = evaluate_by_node(run, classes, PARAMS, engine=PicklingEngine(), slice_us=SLICE_US)
    return _text(one), _text(spread)


@pytest.mark.parametrize("streamed", [False, True], ids=["held", "streamed"])
def test_nodes_without_steps_unmeasured_waits_and_ties_merge_to_the_single_feeds_result(tmp_path, monkeypatch,
                                                                                       streamed):
    if streamed:
        monkeypatch.setattr(step_stream, "NODE_BYTES", 4_000)
    one, spread = _result(tmp_path, _mixed())
    assert spread == one
    details = json.loads(one[0])["Details"]
    assert {"algo-1/0/TRAIN", "algo-3/7/EVAL", "algo-4/0/TRAIN"} <= set(details["ranks"])
    assert details["ranks"]["algo-1/0/TRAIN"]["cause"] == "threads"
    assert details["ranks"]["algo-3/7/EVAL"]["worst_window"] == details["ranks"]["algo-4/0/TRAIN"]["worst_window"]
    assert "algo-1/1/TRAIN" not in details["ranks"]


def test_a_run_whose_waits_are_never_recorded_merges_to_the_single_feeds_verdict(tmp_path):
    one, spread = _result(tmp_path, _all_unmeasured())
    assert spread == one
    assert "Keras on TensorFlow" in json.loads(one[0])["Message"]


def test_the_rule_sent_back_holds_no_replay(tmp_path):
    root = write_run(tmp_path / "run", [make_node("algo-1", 200, 8, 0, seed=1)], _mixed().table())
    run = open_run(str(root)).pinned()
    info = dict(run.info)
    slices = [(a, b) for node, a, b in plan(run, SLICE_US) if node == "algo-1"]
    fed, failed = node_task(str(root), "t", [(InputBound, PARAMS["InputBound"])], set(), info, ("algo-1", slices))
    assert not failed
    back = pickle.loads(pickle.dumps(fed[0]))
    assert back._replay is None and fed[0]._replay is not None


@pytest.mark.parametrize("done", [True, False], ids=["done", "never_done"])
def test_merging_in_memory_node_feeds_gives_the_sequential_result(done):
    """The chunks of test_node_state (two ranks a node, slow steps, loaders), each node's to a fresh rule merged in
    order; with `done` unset too (a node's steps then reach the caller's rule held, and `result()` judges them)."""
    info = run_info(*(node_info(n, end_us=T0 + 200 * 1000 * MS, cores=16) for n in NODES))
    feeds = {node: _node_chunks(node, info, done=done) for node in NODES}
    empty = split_by_time(feeds[NODES[0]][0], [0])[0]  # every node, no rows
    sequential, merged = InputBound(threshold=5), InputBound(threshold=5)
    merged.update(Chunk(empty.system, empty.framework, info))
    for node in NODES:
        worker = InputBound(threshold=5)
        for chunk in feeds[node]:
            sequential.update(chunk)
            worker.update(chunk)
        merged.merge(pickle.loads(pickle.dumps(worker)), node)
    for rule in (sequential, merged):
        rule.update(Chunk(empty.system, empty.framework, info, final=True))
    one, spread = (json.dumps(r.result().to_json(), sort_keys=True) for r in (sequential, merged))
    assert spread == one
    assert json.loads(one)["RuleTriggered"] > 0
