"""StepOutlier fed node by node and merged gives the single feed's result on the cases its logic allows beyond
test_by_node.py's run: a node without framework events, a node with steps of another phase only, steps without a
number, a rank on one node only, nodes at the same times with the same step numbers; held and streamed."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from stallwatch.analyze.rules import step_stream
from stallwatch.analyze.judge.by_node import evaluate_by_node
from stallwatch.analyze.judge.feed import iter_run
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.analyze.rules.step_outlier import StepOutlier
from stallwatch.records import STEP
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import FwGen, spy_replays
from tests.analyze.rules._gen import START_US, make_node
from tests.analyze.judge.test_by_node import MS, SLICE_US, PicklingEngine, S, _text
from tests.present.generated_run import write_run


class CheckingEngine(PicklingEngine):
    """Each StepOutlier sent back holds no replay and only verdicts (its node was said complete)."""

    def map(self, fn: Any, items: Any) -> Any:
        for fed, errors in super().map(fn, items):
            for rule in fed:
                if isinstance(rule, StepOutlier):
                    assert rule._replay is None and not rule._series and not rule._streamed
                    assert not rule._spans and not rule._rates
            yield fed, errors


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: Any) -> str:
    """algo-1: TRAIN steps with stalls on rank 0, rank 5 on this node only. algo-2: snapshots only. algo-3: EVAL
    steps only, and TRAIN steps without a number. algo-4: the same step numbers at the same times as algo-1."""
    frames = [make_node(n, 400, 2, 1, seed=i) for i, n in enumerate(("algo-1", "algo-2", "algo-3"))]
    gen = FwGen()
    t = START_US + 10 * S
    for node in ("algo-1", "algo-4"):
        gen.steps(node=node, rank=0, n=600, start_us=t, slow={30 * k + 7: 700 * MS for k in range(15)}, seed=1)
        gen.steps(node=node, rank=1, n=600, start_us=t, seed=2)
    gen.steps(node="algo-1", rank=5, n=300, start_us=t + 20 * S, step_us=80 * MS, seed=3)
    gen.steps(node="algo-3", rank=0, mode="EVAL", n=400, start_us=t, step_us=50 * MS, seed=4)
    starts = t + 150 * MS * np.arange(200)
    gen.events("algo-3", 1, STEP, "train_step", "TRAIN", None, starts, starts + 100 * MS + (starts // 7) % 3000)
    return str(write_run(tmp_path_factory.mktemp("by_node_steps") / "run", frames, gen.table()))


@pytest.mark.parametrize("streamed", [False, True], ids=["held", "streamed"])
@pytest.mark.parametrize("mode", [None, "TRAIN", "GLOBAL"])
def test_step_outlier_merged_by_node_is_the_single_feed(run_dir, mode, streamed, monkeypatch):
    if streamed:
        monkeypatch.setattr(step_stream, "NODE_BYTES", 20_000)
    reads = spy_replays(monkeypatch)
    run = open_run(run_dir)
    params = {StepOutlier.name: {"mode": mode} if mode else {}}
    one = evaluate([StepOutlier], iter_run(run, [StepOutlier], slice_us=SLICE_US), params)
    spread = evaluate_by_node(run, [StepOutlier], params, engine=CheckingEngine(), slice_us=SLICE_US)
    assert _text(spread) == _text(one)
    assert bool(reads) == (streamed and mode != "GLOBAL")  # the long nodes were read again, on the worker too
    if mode != "GLOBAL":
        assert one[0].triggered and one[0].datapoints > 0


def test_a_pickled_step_outlier_leaves_its_replay_behind():
    rule = StepOutlier()
    rule._replay = lambda *a, **k: iter(())  # type: ignore[assignment]  # a lambda does not pickle
    assert pickle.loads(pickle.dumps(rule))._replay is None
    assert rule._replay is not None
