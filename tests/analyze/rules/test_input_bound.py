"""InputBound on generated framework events with planted patterns: a starved rank fires with the cause it
sees (main-process loading, too few workers, a slow fetch, isolated stalls named by step), a well-fed or
mildly waiting rank stays silent, windows after patience only, and one chunk or many give the same result."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze.rules.input_bound import InputBound

from ._fw_gen import MS, FwGen, assert_chunk_invariant, evaluate, node_info, run_info, whole


def _ranks(out: dict) -> dict:
    return out["Details"]["ranks"]


def test_a_starved_rank_fires_and_a_fed_one_does_not():
    """Planted: rank 0 waits 60 ms of each 100 ms step (num_workers=0); rank 1 waits 2 ms."""
    gen = FwGen()
    gen.steps(rank=0, n=400, data_wait_us=60 * MS, jitter_us=0)
    gen.dataloader(rank=0, num_workers=0)
    gen.steps(rank=1, n=400, data_wait_us=2 * MS, jitter_us=0)
    gen.dataloader(rank=1, num_workers=4)
    out = evaluate(InputBound, whole(gen.table()))
    r0, r1 = _ranks(out)["algo-1/0/TRAIN"], _ranks(out)["algo-1/1/TRAIN"]
    assert (out["RuleTriggered"], out["Datapoints"]) == (1, 800)
    assert r0["wait_share"] == pytest.approx(60.0) and r0["triggered"] and r0["cause"] == "main_process"
    assert r0["windows_above"] == 400 - 10 - 100 + 1  # every window position after patience
    assert r0["worst_window"]["first_step"] == 10 and r0["time_at_stake_s"] == pytest.approx(24.0)
    assert not r1["triggered"] and r1["cause"] is None and r1["wait_share"] == pytest.approx(2.0)
    assert out["Details"]["time_at_stake_s"] == pytest.approx(24.0) and out["Details"]["ranks_fired"] == ["algo-1/0"]
    assert "num_workers=0" in out["Recommendation"] and "num_workers=" in out["Recommendation"]
    assert out["Details"]["title"].startswith("Training waits for data 60 % of the time on rank algo-1/0")


@pytest.mark.parametrize("wait_ms, fires", [(15, False), (19, False), (21, True)])
def test_the_threshold(wait_ms, fires):
    """A compute-bound loop with some waiting (15 % of each step) is not starved; over 20 % it is."""
    gen = FwGen()
    gen.steps(n=300, data_wait_us=wait_ms * MS, jitter_us=0)
    assert bool(evaluate(InputBound, whole(gen.table()))["RuleTriggered"]) is fires


def test_too_few_workers_for_the_free_cores():
    """Planted: 2 workers for one rank on a 16-core node, 50 % wait: try num_workers=16 (the Dataloader rule's
    count too: the two rules never advise two counts)."""
    gen = FwGen()
    gen.steps(n=300, data_wait_us=50 * MS, jitter_us=0)
    gen.dataloader(num_workers=2)
    out = evaluate(InputBound, whole(gen.table(), run=run_info(node_info(cores=16))))
    entry = _ranks(out)["algo-1/0/TRAIN"]
    assert entry["cause"] == "too_few_workers" and entry["free_cores_per_rank"] == 16
    assert "Try num_workers=16" in out["Recommendation"]


def test_enough_workers_but_a_slow_fetch():
    gen = FwGen()
    gen.steps(n=300, data_wait_us=50 * MS, jitter_us=0)
    gen.dataloader(num_workers=8)
    out = evaluate(InputBound, whole(gen.table(), run=run_info(node_info(cores=8))))
    assert _ranks(out)["algo-1/0/TRAIN"]["cause"] == "slow_fetch" and "cheaper" in out["Recommendation"]


STALLS = list(range(100, 1000, 75))


def _stalled(hiccups: range = range(0)) -> dict:
    """1,000 steps of 100 ms waiting 1 ms each, but 2 s at STALLS (and 20 ms at `hiccups`): InputBound's result."""
    waits = np.full(1000, 1 * MS)
    waits[hiccups] = 20 * MS
    waits[STALLS] = 2000 * MS
    gen = FwGen()
    gen.steps(n=1000, data_wait_us=waits, slow={n: 2100 * MS for n in STALLS}, jitter_us=0)
    gen.dataloader(num_workers=4)
    return evaluate(InputBound, whole(gen.table()))


def test_isolated_stalls_are_named():
    """Planted: 12 stalls of 2 s in 1,000 steps of 100 ms (otherwise 1 ms waits): 24 s of 124 s waiting."""
    out = _stalled()
    entry = _ranks(out)["algo-1/0/TRAIN"]
    assert entry["triggered"] and entry["cause"] == "stalls" and entry["stalls"] == len(STALLS)
    assert entry["stall_steps"] == STALLS and out["Details"]["steps"] == STALLS
    assert entry["time_at_stake_s"] == pytest.approx(24.0)
    assert "long stalls" in out["Recommendation"] and "100, 175" in out["Recommendation"]


def test_a_hiccup_of_a_fraction_of_a_step_is_not_a_stall():
    """Waits of 20 ms in 100 ms steps (20× the 1 ms typical wait, a busy machine's scheduling) are not named beside
    the 12 planted 2 s reads: a stall costs at least half a typical step."""
    entry = _ranks(_stalled(hiccups=range(110, 1000, 45)))["algo-1/0/TRAIN"]
    assert entry["cause"] == "stalls" and entry["stall_steps"] == STALLS


def test_patience_and_a_short_run():
    """The first `patience` steps (start-up) never decide; a run shorter than a window is one window (a short
    job that waits for data all the time was called healthy), unless it has too few steps to say."""
    gen = FwGen()
    waits = np.r_[np.full(10, 90 * MS), np.full(290, 2 * MS)]
    gen.steps(n=300, data_wait_us=waits, jitter_us=0)
    assert evaluate(InputBound, whole(gen.table()))["RuleTriggered"] == 0
    short = FwGen()
    short.steps(n=50, data_wait_us=60 * MS, jitter_us=0)
    entry = _ranks(evaluate(InputBound, whole(short.table())))["algo-1/0/TRAIN"]
    assert entry["windows_above"] == 1 and entry["worst_window"]["steps"] == 40 and entry["triggered"]
    tiny = FwGen()
    tiny.steps(n=25, data_wait_us=60 * MS, jitter_us=0)  # 15 steps after patience: too few to judge
    entry = _ranks(evaluate(InputBound, whole(tiny.table())))["algo-1/0/TRAIN"]
    assert entry["windows_above"] == 0 and not entry["triggered"]


def test_eval_only_runs_are_judged_on_their_steps_and_no_framework_is_not_applicable():
    gen = FwGen()
    gen.steps(mode="EVAL", n=300, data_wait_us=50 * MS, jitter_us=0)
    out = evaluate(InputBound, whole(gen.table()))
    assert list(_ranks(out)) == ["algo-1/0/EVAL"] and out["RuleTriggered"] == 1
    assert evaluate(InputBound, whole())["Status"] == "not_applicable"


def test_chunk_invariance():
    gen = FwGen()
    rng = np.random.default_rng(3)
    gen.steps(rank=0, n=700, data_wait_us=rng.integers(0, 60 * MS, 700), seed=1)
    gen.steps(rank=1, n=700, data_wait_us=rng.integers(0, 10 * MS, 700), seed=2)
    gen.dataloader(rank=0, num_workers=1)
    assert_chunk_invariant(InputBound, whole(gen.table()))
