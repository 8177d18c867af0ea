"""Dataloader and OverallFrameworkMetrics fed node by node and merged give the single feed's results on a run whose
nodes differ where these rules look: worker-count snapshots on some nodes only, a node with snapshots and no
events, a node with neither for the rules, ranks on one node only, a loader re-created with other settings, a
Keras in-memory input, unmeasured waits, sampled (untimed) steps, operator tables, and the same wait durations
on every node (ties in the whole-run distribution)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from stallwatch.analyze.rules.dataloader import Dataloader
from stallwatch.analyze.rules.framework_metrics import OverallFrameworkMetrics
from stallwatch.records import EVAL, TRAIN
from stallwatch.store import layout, profiles_codec
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import FwGen
from tests.analyze.rules._gen import START_US, make_node
from tests.analyze.judge.test_by_node import MS, S, _both
from tests.present.generated_run import write_run

LOOP = START_US + 60 * S


def _alive(frame: Any, inside: float, outside: float = 0.0) -> None:
    """`proc/workers_alive`: `inside` from the loop's start, `outside` before."""
    frame.columns["proc/workers_alive"] = np.where(frame.timestamps >= LOOP, inside, outside)


def _operators(loc: RunLocation, node: str, rank: int, window: str, rows: list[tuple[str, str, int, float]]) -> None:
    d = layout.trace_window_dir(node, rank, window)
    loc.write_atomic(f"{d}/{layout.OPERATORS_PARQUET}", profiles_codec.encode_operators(
        [{"operator": o, "device": dev, "calls": c, "self_us": us, "total_us": us} for o, dev, c, us in rows]))
    record = {"layer": "detailed", "start_us": LOOP, "end_us": LOOP + S, "node": node, "rank": rank, "window": window,
              "files": [layout.OPERATORS_PARQUET], "summary_error": None, "mode": TRAIN, "status": "complete"}
    loc.write_atomic(f"{d}/{layout.WINDOW_JSON}", json.dumps(record).encode())


@pytest.fixture(scope="module")
def varied_run(tmp_path_factory: Any) -> str:
    """algo-1: 8 cores, 3 workers alive in the loop (below), two ranks starved (40 ms of 100 ms steps).
    algo-2: no snapshots of the worker count; rank 0 re-creates its loader later with other settings, rank 3
    (only here) runs EVAL steps only. algo-3: worker-count snapshots, no events. algo-4: a Keras in-memory input
    whose waits are not measured, a sampled stretch. algo-5: nothing for these rules."""
    frames = [make_node("algo-1", 600, 8, 1, seed=1), make_node("algo-2", 600, 4, 0, seed=2),
              make_node("algo-3", 600, 4, 1, seed=3), make_node("algo-4", 300, 2, 0, seed=4),
              make_node("algo-5", 100, 4, 0, seed=5)]
    _alive(frames[0], 3.0)
    _alive(frames[2], 2.0, 1.0)
    gen = FwGen()
    for rank, workers in ((0, 2), (1, 1)):
        gen.dataloader(node="algo-1", rank=rank, at_us=LOOP - S, num_workers=workers, pin_memory=rank == 0)
        gen.steps(node="algo-1", rank=rank, n=1500, start_us=LOOP, jitter_us=0, data_wait_us=40 * MS)
    gen.dataloader(node="algo-2", rank=0, at_us=LOOP - S, num_workers=4)
    gen.dataloader(node="algo-2", rank=0, at_us=LOOP + 150 * S, num_workers=8, batch_size=64)
    _, e = gen.steps(node="algo-2", rank=0, n=800, start_us=LOOP, jitter_us=0, data_wait_us=5 * MS)
    gen.steps(node="algo-2", rank=0, mode=EVAL, n=100, start_us=int(e[-1]) + S, jitter_us=0, data_wait_us=5 * MS)
    gen.dataloader(node="algo-2", rank=3, at_us=LOOP - 2 * S, loader_id="val", num_workers=0, prefetch_factor=None)
    gen.steps(node="algo-2", rank=3, mode=EVAL, n=900, start_us=LOOP - S, step_us=50 * MS, data_wait_us=5 * MS)
    keras = json.dumps({"framework": "keras", "input": "arrays", "in_memory": True, "loop": "fit",
                        "batch_size": 32, "num_workers": 0})
    gen.events("algo-4", 0, "dataloader", "ndarray", "GLOBAL", None, LOOP - S, LOOP - S, keras)
    gen.events("algo-4", 0, "loop", "fit", TRAIN, None, LOOP - S, LOOP - S,
               json.dumps({"phases": ["step", "forward", "backward"]}))
    _, e = gen.steps(node="algo-4", rank=0, n=200, start_us=LOOP, phases=False)
    gen.events("algo-4", 0, "untimed", "steps", TRAIN, None, int(e[-1]) + S, int(e[-1]) + 5 * S)
    gen.steps(node="algo-4", rank=0, mode=EVAL, n=50, start_us=int(e[-1]) + 6 * S, phases=False)
    root = write_run(tmp_path_factory.mktemp("by_node_dataloader") / "run", frames, gen.table())
    loc = RunLocation(str(root))
    _operators(loc, "algo-1", 0, layout.window_name("detailed", LOOP),
               [("aten::mm", "cpu", 10, 300.0), ("sgemm", "cuda", 10, 600.0)])
    _operators(loc, "algo-2", 3, layout.window_name("detailed", LOOP + S),
               [("aten::mm", "cpu", 5, 300.0), ("aten::add", "cpu", 5, 120.0)])
    return str(root)


def test_varied_nodes_merge_to_the_single_feeds_result(varied_run):
    one, spread = _both(varied_run, [Dataloader, OverallFrameworkMetrics])
    assert spread == one
    loader, metrics = (json.loads(text) for text in one)
    nodes = loader["Details"]["nodes"]
    assert set(nodes) == {"algo-1", "algo-2", "algo-3", "algo-4"}
    assert (nodes["algo-1"]["source"], nodes["algo-1"]["dataloaders"]) == ("proc/workers_alive", 3.0)
    assert (nodes["algo-1"]["triggered"], nodes["algo-1"]["reason"]) == (True, "below")
    assert nodes["algo-2"]["source"].startswith("dataloader events") and nodes["algo-2"]["ranks"] == 2
    assert nodes["algo-3"]["source"] == "proc/workers_alive" and nodes["algo-4"]["reason"] == "in_memory"
    assert loader["Details"]["loaders_total"] == 5 and "algo-2/3" in loader["Details"]["typical_wait_share"]
    again = [e for e in loader["Details"]["loaders"] if (e["node"], e["rank"]) == ("algo-2", 0)]
    assert [(e["iterators"], e["num_workers"]) for e in again] == [(2, 4)]  # settings of its first iterator
    details = metrics["Details"]
    assert details["untimed_us"] == {TRAIN: 4 * S} and {"algo-2/3", "algo-4/0"} <= set(details["ranks"])
    assert details["operator_windows"] == 2 and details["operators"]["CPU_count"] == 2


def test_either_rule_alone_merges_the_same(varied_run):
    """Each rule fed by itself (its own metrics read): the same equality."""
    run = open_run(varied_run)
    assert run.operators().num_rows == 4
    for cls in (Dataloader, OverallFrameworkMetrics):
        one, spread = _both(varied_run, [cls])
        assert spread == one
