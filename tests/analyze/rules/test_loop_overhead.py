"""LoopOverhead on generated framework events: a loop without a DataLoader that spends a quarter of each step in its
own code (batches built by hand) fires and says so; a tight loop, a micro loop whose own code is a fraction of a
millisecond, a DataLoader's loop (InputBound's), a loop whose phases are not timed and a node with GPUs stay
silent; one chunk or many give the same result."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze.rules.loop_overhead import LoopOverhead
from stallwatch.records import BACKWARD, DATA_WAIT, FORWARD, OPTIMIZER, STEP, TRAIN

from ._fw_gen import MS, T0, FwGen, assert_chunk_invariant, evaluate, snapshots, whole


def _loop(gen: FwGen, *, rank: int = 0, n: int = 300, step_us: int = 100 * MS, outside_pct: float = 25.0,
          wait_us: int = 0, forward: bool = True, node: str = "algo-1") -> None:
    """`n` TRAIN steps of `step_us`, each: a data wait (if any), forward, backward and optimizer filling all
    but `outside_pct` % of the step, which is the loop's own code (after the optimizer)."""
    numbers = np.arange(n, dtype=np.int64)
    starts = T0 + numbers * (step_us + MS)
    timed = int(step_us * (100 - outside_pct) / 100) - wait_us
    gen.events(node, rank, STEP, "train_step", TRAIN, numbers, starts, starts + step_us)
    at = starts
    if wait_us:
        gen.events(node, rank, DATA_WAIT, "next_batch", TRAIN, numbers, at, at + wait_us)
        at = at + wait_us
    for kind, share in ((FORWARD, 4), (BACKWARD, 5), (OPTIMIZER, 1)):
        length = timed * share // 10
        if kind != FORWARD or forward:
            gen.events(node, rank, kind, kind, TRAIN, numbers, at, at + length)
        at = at + length


def _ranks(out: dict) -> dict:
    return out["Details"]["ranks"]


def test_a_loop_that_builds_its_batches_by_hand_fires_and_a_tight_one_does_not():
    gen = FwGen()
    _loop(gen, rank=0, outside_pct=25)  # nanoGPT-style: no DataLoader, a quarter of the step outside the phases
    _loop(gen, rank=1, outside_pct=5)
    _loop(gen, rank=2, outside_pct=60, wait_us=10 * MS)  # a DataLoader's: InputBound's to judge, not this rule's
    out = evaluate(LoopOverhead, whole(gen.table()))
    r0, r1, r2 = _ranks(out)["algo-1/0"], _ranks(out)["algo-1/1"], _ranks(out)["algo-1/2"]
    assert (out["RuleTriggered"], out["Datapoints"]) == (1, 600)
    assert r0["triggered"] and r0["outside_share"] == pytest.approx(25.0) and not r0["dataloader"]
    assert r0["windows_above"] == 300 - 10 - 100 + 1 and r0["worst_window"]["outside_ms_per_step"] == pytest.approx(25)
    assert r0["time_at_stake_s"] == pytest.approx(300 * 0.025)
    assert not r1["triggered"] and r1["judged"] and r1["outside_share"] == pytest.approx(5.0)
    assert r2["dataloader"] and not r2["judged"] and not r2["triggered"] and "DataLoader" in r2["not_judged"]
    assert out["Details"]["ranks_fired"] == ["algo-1/0"] and out["Details"]["nodes"] == ["algo-1"]
    assert out["Details"]["title"].startswith("25 % of each training step is spent outside the model")
    assert "no DataLoader" in out["Details"]["title"]
    assert "iterates no DataLoader" in out["Recommendation"] and "get_batch" in out["Recommendation"]


@pytest.mark.parametrize("outside_pct, fires", [(15, False), (19, False), (22, True)])
def test_the_threshold(outside_pct, fires):
    gen = FwGen()
    _loop(gen, outside_pct=outside_pct)
    assert bool(evaluate(LoopOverhead, whole(gen.table()))["RuleTriggered"]) is fires


def test_a_micro_loop_whose_own_code_is_a_fraction_of_a_millisecond_is_not_flagged():
    """30 % of a 2 ms step is 0.6 ms of the loop's own code (zero_grad, the loss, the loop itself): below
    `min_ms`, not worth a finding; with min_ms=0.5 it is."""
    gen = FwGen()
    _loop(gen, step_us=2 * MS, outside_pct=30)
    assert evaluate(LoopOverhead, whole(gen.table()))["RuleTriggered"] == 0
    assert evaluate(LoopOverhead, whole(gen.table()), min_ms=0.5)["RuleTriggered"] == 1


def test_untimed_phases_and_gpu_nodes_are_not_judged():
    """Without the model's forward timed (Keras on JAX records only the data wait), the time outside the phases
    is unknown, not large; on a node with GPUs the host's timings are kernel launches."""
    gen = FwGen()
    _loop(gen, forward=False, outside_pct=60)
    out = evaluate(LoopOverhead, whole(gen.table()))
    assert out["RuleTriggered"] == 0 and out["Status"] != "ok" and "forward pass is not timed" in out["Message"]
    gen = FwGen()
    _loop(gen, outside_pct=60)
    gpus = {"algo-1": snapshots("algo-1", T0, T0 + 40_000 * MS, gpu0__gpu_util=90.0)}
    out = evaluate(LoopOverhead, whole(gen.table(), system=gpus))
    assert out["RuleTriggered"] == 0 and "GPUs" in out["Message"]


def test_one_chunk_or_many_give_the_same_result():
    gen = FwGen()
    _loop(gen, rank=0, outside_pct=30)
    _loop(gen, rank=1, outside_pct=10)
    out = assert_chunk_invariant(LoopOverhead, whole(gen.table()))
    assert out["RuleTriggered"] == 1
