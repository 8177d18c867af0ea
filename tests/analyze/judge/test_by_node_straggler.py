"""Straggler fed node by node and merged, in each of its modes: steps kept in memory, let go on the worker (a node
past NODE_BYTES, or past KEEP_BYTES alone), or let go only when merged (two nodes together past KEEP_BYTES): the
merged rule ends in the mode of the single feed, with its result."""

from __future__ import annotations

from typing import Any

import pytest

from stallwatch.analyze.rules import straggler
from stallwatch.analyze.judge.by_node import evaluate_by_node
from stallwatch.analyze.judge.feed import iter_run
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.analyze.rules.straggler import Straggler
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import FwGen
from tests.analyze.rules._gen import START_US, make_node
from tests.analyze.judge.test_by_node import PicklingEngine, _text
from tests.present.generated_run import write_run

S, MS = 1_000_000, 1_000
SLICE_US = 15 * S
PARAMS = {"Straggler": {"window": 50}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: Any) -> str:
    """algo-1: two even ranks. algo-2: its rank 1 straggles, its steps start before algo-1's end. algo-3: one rank
    (7, on no other node), numbered from 200. algo-4: snapshots only."""
    frames = [make_node(f"algo-{k}", 240, 2, 1, seed=k) for k in (1, 2, 3, 4)]
    gen = FwGen()
    t = START_US + 10 * S
    for rank in (0, 1):
        gen.steps(node="algo-1", rank=rank, n=400, start_us=t, seed=rank)
        gen.steps(node="algo-2", rank=rank, n=400, start_us=t + 30 * S, step_us=100 * MS if rank == 0 else 140 * MS,
                  seed=rank + 2)
    gen.steps(node="algo-3", rank=7, n=400, first_step=200, start_us=t + 5 * S, seed=9)
    return str(write_run(tmp_path_factory.mktemp("by_node_straggler") / "run", frames, gen.table()))


# (KEEP_BYTES, NODE_BYTES) and whether worker rules / the merged rule let steps go. A node's two ranks keep
# ≈ 6.4 kB of steps and 6.4 kB of starts: 16 kB is passed by algo-1 and algo-2 together, by neither alone.
BUDGETS = {"memory": (1 << 30, 1 << 30, False, False), "merged past KEEP_BYTES": (16_000, 1 << 30, False, True),
           "worker past KEEP_BYTES": (0, 1 << 30, True, True), "worker past NODE_BYTES": (1 << 30, 2_000, True, True)}


@pytest.mark.parametrize("budget", BUDGETS)
def test_merged_in_any_mode_gives_the_single_feeds_mode_and_result(run_dir, budget, monkeypatch):
    keep, node, on_worker, merged = BUDGETS[budget]
    monkeypatch.setattr(straggler, "KEEP_BYTES", keep)
    monkeypatch.setattr(straggler, "NODE_BYTES", node)
    modes: list[bool] = []  # `_replaying` of each rule when its result is asked
    workers: list[bool] = []  # … of each worker's rule, as merged
    result, merge = Straggler.result, Straggler.merge

    def spy_result(self: Straggler) -> Any:
        modes.append(self._replaying)
        return result(self)

    def spy_merge(self: Straggler, other: Any, node: str) -> None:
        assert other._replay is None  # pickled without the worker's replay
        workers.append(other._replaying)
        merge(self, other, node)

    monkeypatch.setattr(Straggler, "result", spy_result)
    monkeypatch.setattr(Straggler, "merge", spy_merge)
    run = open_run(run_dir)
    one = evaluate([Straggler], iter_run(run, [Straggler], slice_us=SLICE_US), PARAMS)
    spread = evaluate_by_node(run, [Straggler], PARAMS, engine=PicklingEngine(), slice_us=SLICE_US)
    assert _text(spread) == _text(one)
    assert one[0].triggered and one[0].details["ranks_fired"] == ["algo-2/1"]
    assert modes == [merged, merged]
    assert any(workers) == on_worker and len(workers) == 4
