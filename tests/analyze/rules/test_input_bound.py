"""InputBound on generated framework events with planted patterns: a starved rank fires with the cause it
sees (main-process loading, too few workers, a slow fetch, isolated stalls named by step), a well-fed or
mildly waiting rank stays silent, windows after patience only, and one chunk or many give the same result."""

from __future__ import annotations

import re

import numpy as np
import pytest

from stallwatch.analyze.rules.input_bound import InputBound

from ._fw_gen import MS, S, T0, FwGen, assert_chunk_invariant, evaluate, node_info, run_info, snapshots, whole


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


# -- each loader on its own (issue 35) ---------------------------------------------------------------------------


def _two_loaders(train_workers: int, eval_iterators: int = 5, **system: object) -> dict:
    """A training loop waiting 50 % of its steps for loader 1 (`train_workers`), and an evaluation loop fed by
    loader 2 with num_workers=0 whose iterators outnumber the training loader's (persistent workers)."""
    gen = FwGen()
    gen.dataloader(key=1, created_at="/job/train.py:40", name="Train", num_workers=train_workers, loader_id="11")
    for i in range(eval_iterators):
        gen.dataloader(key=2, created_at="/job/train.py:41", name="Val", num_workers=0, loader_id="12",
                       at_us=T0 + (i + 1) * S)
    starts, ends = gen.steps(n=300, data_wait_us=50 * MS, jitter_us=0, loader=1)
    gen.steps(mode="EVAL", n=50, data_wait_us=80 * MS, jitter_us=0, loader=2, start_us=int(ends[-1]) + S)
    frames = {}
    if system:
        frames = {"algo-1": snapshots("algo-1", T0, int(ends[-1]) + 60 * S, 1 * S, **system)}
    return evaluate(InputBound, whole(gen.table(), frames, run=run_info(node_info(cores=2))))


def test_the_training_loop_is_judged_on_its_own_loader_not_the_evaluation_one():
    """The README demo's shape: the median over the rank's iterators said num_workers=0 (the evaluation loader's)
    and advised num_workers=1 to a training loader that had 2. The loader the loop waited for is judged."""
    out = _two_loaders(train_workers=2)
    entry = _ranks(out)["algo-1/0/TRAIN"]
    assert entry["num_workers"] == 2 and entry["cause"] == "slow_fetch", entry
    assert entry["loader"]["created_at"] == "/job/train.py:40" and entry["loader"]["dataset"] == "Train"
    assert [x["key"] for x in entry["loaders"]] == [1]
    rec = out["Recommendation"]
    assert "num_workers=0" not in rec and "num_workers=1" not in rec and "num_workers=2" not in rec, rec
    assert "training loader (Train, train.py:40)" in rec


def test_older_runs_without_loader_keys_never_read_the_evaluation_loader_as_the_training_one():
    gen = FwGen()
    gen.dataloader(num_workers=2, loader_id="a")
    for i in range(5):
        gen.dataloader(num_workers=0, loader_id="b", at_us=T0 + (i + 1) * S)
    gen.steps(n=300, data_wait_us=50 * MS, jitter_us=0)
    out = evaluate(InputBound, whole(gen.table(), run=run_info(node_info(cores=2))))
    entry = _ranks(out)["algo-1/0/TRAIN"]
    assert entry["cause"] != "main_process" and entry["num_workers"] == 2 and "loader" not in entry


def test_workers_that_already_use_the_cores_are_not_told_to_add_more():
    """2 workers busy all the time on a 2-core node with no idle core: more workers cannot help; the time at stake
    is at most what the workers' CPU held of the cores."""
    out = _two_loaders(train_workers=2, cpu__cpu_util=98.0, proc__workers_busy=2.0, proc__workers_cpu_util=40.0)
    entry = _ranks(out)["algo-1/0/TRAIN"]
    assert entry["cause"] == "cpu_bound" and entry["idle_cores"] == pytest.approx(0.04)
    assert "more workers cannot help" in out["Recommendation"] and "cache" in out["Recommendation"]
    assert _advised(out["Recommendation"]) == []
    assert entry["time_at_stake_s"] == pytest.approx(min(entry["wait_s"], 0.4 * entry["step_s"]))
    assert entry["time_at_stake_s"] < entry["wait_s"]


def test_idle_workers_on_a_busy_node_are_not_cpu_bound():
    """Workers that wait on I/O (not busy) on a node that others keep busy: not the workers' CPU."""
    out = _two_loaders(train_workers=2, cpu__cpu_util=98.0, proc__workers_busy=0.0, proc__workers_cpu_util=1.0)
    assert _ranks(out)["algo-1/0/TRAIN"]["cause"] == "slow_fetch"


def test_a_tight_in_memory_loop_is_told_to_index_in_batches_not_to_use_workers():
    """0.4 ms steps waiting 0.12 ms for an in-memory batch collated in the main process: a worker's hand-over costs
    more than the fetch, so index the tensors in batches."""
    gen = FwGen()
    gen.dataloader(key=1, created_at="/job/tight.py:9", name="TensorDataset", num_workers=0)
    gen.steps(n=3000, step_us=400, gap_us=0, data_wait_us=120, jitter_us=0, loader=1)
    out = evaluate(InputBound, whole(gen.table(), run=run_info(node_info(cores=8))))
    entry = _ranks(out)["algo-1/0/TRAIN"]
    assert entry["triggered"] and entry["cause"] == "cheap_fetch"
    assert "BatchSampler" in out["Recommendation"] and _advised(out["Recommendation"]) == []


def test_an_evaluation_only_loop_is_not_called_training():
    gen = FwGen()
    gen.steps(mode="EVAL", n=300, data_wait_us=50 * MS, jitter_us=0)
    out = evaluate(InputBound, whole(gen.table()))
    assert out["Details"]["title"].startswith("Evaluation waits for data"), out["Details"]["title"]


@pytest.mark.parametrize("workers, cores", [(0, 2), (1, 2), (2, 2), (3, 2), (2, 16), (15, 16), (16, 16), (40, 16)])
def test_the_advice_never_names_a_worker_count_at_or_below_the_loaders(workers, cores):
    gen = FwGen()
    gen.dataloader(key=1, num_workers=workers)
    gen.steps(n=300, data_wait_us=50 * MS, jitter_us=0, loader=1)
    out = evaluate(InputBound, whole(gen.table(), run=run_info(node_info(cores=cores))))
    advised = _advised(out["Recommendation"])
    assert all(n > workers for n in advised), (advised, out["Recommendation"])


def _advised(text: str) -> list[int]:
    """The worker counts a recommendation advises (not the loader's own, said in parentheses)."""
    return [int(x) for x in re.findall(r"(?<!\()num_workers=(\d+)", text)]
