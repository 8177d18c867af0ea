"""Dataloader on generated framework events and worker-count snapshots with planted patterns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from stallwatch.analyze.rules.base import ParameterError
from stallwatch.analyze.rules.dataloader import Dataloader
from stallwatch.records import EVAL, TRAIN

from ._fw_gen import MINUTE, MS, T0, FwGen, S, assert_chunk_invariant, evaluate, node_info, run_info, snapshots, whole

LOOP_START = T0 + 10 * MINUTE  # the training loop starts after 10 minutes of initialization


STARVED_MS = 40  # a wait for each batch of 40 % of a ~100 ms step: material (wait_threshold 20 %)


def loader_run(workers_in_loop: float | None, *, cores: int = 8, ranks: int = 1, num_workers: int = 4,
               pin_memory: bool = True, gpus: int = 1, waits_ms=STARVED_MS, prefetch_factor: int | None = 2):
    """Job starts at T0; each rank creates a DataLoader at LOOP_START and runs 500 TRAIN steps of ~100 ms, each
    waiting `waits_ms` for its batch (40 ms: the loop is starved, unless a test says otherwise).
    `proc/workers_alive` is 0 during initialization (60 snapshots) and `workers_in_loop` during the loop (about
    5 snapshots) — None leaves the metric out."""
    gen = FwGen()
    end = LOOP_START
    for rank in range(ranks):
        gen.dataloader(rank=rank, at_us=LOOP_START - 1 * S, num_workers=num_workers, pin_memory=pin_memory,
                       prefetch_factor=prefetch_factor)
        _, ends = gen.steps(rank=rank, n=500, start_us=LOOP_START, seed=rank,
                            data_wait_us=5 * MS if waits_ms is None else np.asarray(waits_ms) * MS)
        end = max(end, int(ends[-1]))
    info = node_info(start_us=T0, end_us=end + 30 * S, cores=cores, gpus=gpus)
    series = {}
    if workers_in_loop is not None:
        series["proc__workers_alive"] = lambda ts: np.where((ts >= LOOP_START) & (ts <= end), workers_in_loop, 0.0)
    system = {"algo-1": snapshots("algo-1", T0, end + 30 * S, interval_us=10 * S, info=info, cpu__cpu_util=30,
                                  **series)}
    return whole(gen.table(), system, run_info(info))


@pytest.mark.parametrize("workers, reason", [
    (5, "below"),        # 62.5 % of 8 cores < 70 %
    (6, "slow_fetch"),   # 75 %: enough workers, yet the loop waits
    (16, "slow_fetch"),  # 200 %: not above
    (17, "above"),       # 212.5 %
])
def test_a_starved_loop_fires_and_the_reason_follows_the_worker_count(workers, reason):
    out = evaluate(Dataloader, loader_run(workers))
    node = out["Details"]["nodes"]["algo-1"]
    assert node["dataloaders"] == workers and node["source"] == "proc/workers_alive"
    assert node["percent"] == pytest.approx(100 * workers / 8)
    assert (node["triggered"], node["reason"]) == (True, reason)
    assert node["wait_share"] == pytest.approx(40.0, abs=1.0) and out["Details"]["bottleneck"] is True
    assert (out["RuleTriggered"], out["Violations"]) == (1, 1)
    assert out["Details"]["cores"] == 8 and out["Details"]["dataloaders"] == workers
    assert out["RuleParameters"] == "min_threshold:70\nmax_threshold:200\nwait_threshold:20\nmin_wait_ms:1.0"
    if reason in ("below", "above"):
        assert f"ran {workers} data-loader workers in parallel on 8 CPU cores" in out["Recommendation"]
        assert "try num_workers=8" in out["Recommendation"]
    else:
        assert "cannot keep up" in out["Recommendation"]


@pytest.mark.parametrize("workers, wait_ms", [(0, 1), (0, 15), (5, 5), (17, 12)])
def test_no_material_wait_no_finding_whatever_the_workers(workers, wait_ms):
    """In-memory data with num_workers=0 waits ~1 % (DDP, Hugging Face, Lightning runs); a compute-bound run
    with 10–15 % waiting is not starved either: the loader is not a bottleneck and nothing is recommended."""
    out = evaluate(Dataloader, loader_run(workers, num_workers=workers, waits_ms=wait_ms))
    node = out["Details"]["nodes"]["algo-1"]
    assert (node["triggered"], node["reason"]) == (False, "not_a_bottleneck")
    assert out["RuleTriggered"] == 0 and out["Details"]["bottleneck"] is False
    assert out["Recommendation"].startswith("The data loader is not a bottleneck")
    assert "num_workers=" not in out["Recommendation"] and "pin_memory" not in out["Recommendation"]


def test_a_few_long_stalls_are_not_the_workers_problem():
    """Planted: 5 ms waits, and 1 step in 7 waits 95 ms of its ~100 ms (a slow read): 18 % of the time waiting, but
    a typical step waits 5 %: more workers would not help, the rule stays silent (InputBound names the stalls)."""
    waits = np.full(500, 5.0)
    waits[::7] = 95.0
    out = evaluate(Dataloader, loader_run(2, num_workers=0, waits_ms=waits))
    assert out["RuleTriggered"] == 0 and out["Details"]["bottleneck"] is False
    assert out["Details"]["wait_share"]["algo-1/0"] > 3 * out["Details"]["typical_wait_share"]["algo-1/0"]


def test_dataloader_counts_workers_during_the_training_loop_only():
    """Planted: 0 workers for 10 minutes of initialization, 6 during the (shorter) training loop: the run's
    overall median would be 0 (fires); the loop's is 6 of 8 cores (75 %, does not fire)."""
    out = evaluate(Dataloader, loader_run(6))
    node = out["Details"]["nodes"]["algo-1"]
    assert node["dataloaders"] == 6 and node["reason"] == "slow_fetch"  # not "below": the loop's median counts
    assert out["Datapoints"] == node["samples"] < 60  # only the loop's snapshots


@pytest.mark.parametrize("num_workers, reason", [(2, "below"), (3, "slow_fetch")])
def test_dataloader_falls_back_to_num_workers_per_rank(num_workers, reason):
    """Planted: no workers_alive metric; 2 starved ranks each with a loader of `num_workers` on 8 cores: 4 workers
    (50 %) are too few, 6 (75 %) enough (the fetch itself is slow)."""
    out = evaluate(Dataloader, loader_run(None, ranks=2, num_workers=num_workers))
    node = out["Details"]["nodes"]["algo-1"]
    assert node["source"].startswith("dataloader events")
    assert node["dataloaders"] == 2 * num_workers and node["ranks"] == 2 and node["reason"] == reason
    assert out["RuleTriggered"] == 1 and out["Datapoints"] == 2
    assert set(out["Details"]["wait_share"]) == {"algo-1/0", "algo-1/1"}
    if reason == "below":
        assert "try num_workers=4 per rank (2 ranks share the node)" in out["Recommendation"]


def test_dataloader_settings_pin_memory_and_prefetch():
    """Planted: loaders without pinned memory and without workers (no prefetching) on a GPU node."""
    out = evaluate(Dataloader, loader_run(0, num_workers=0, pin_memory=False, prefetch_factor=None))
    d = out["Details"]
    assert (d["num_workers"], d["pin_memory"], d["prefetch"], d["batch_size"]) == (0, False, False, 32)
    assert d["loaders"][0]["dataset"] == "ImageDataset" and d["loaders"][0]["iterators"] == 1
    assert "pin_memory=True" in out["Recommendation"] and "not prefetched" in out["Recommendation"]
    cpu_only = evaluate(Dataloader, loader_run(0, num_workers=0, pin_memory=False, gpus=0))
    assert "pin_memory" not in cpu_only["Recommendation"]
    fed = evaluate(Dataloader, loader_run(0, num_workers=0, pin_memory=False, waits_ms=1))
    assert "pin_memory" not in fed["Recommendation"] and "prefetched" not in fed["Recommendation"]
    good = evaluate(Dataloader, loader_run(8))
    assert (good["Details"]["pin_memory"], good["Details"]["prefetch"]) == (True, True)


def test_dataloader_dataloading_time_of_train_waits_in_seconds():
    """Planted: the 500 TRAIN steps wait 0.1, 0.2, …, 50 ms for their batch; EVAL waits (1 s) are left out."""
    chunk = loader_run(8, waits_ms=np.arange(1, 501) / 10)
    gen = FwGen()
    gen.steps(mode=EVAL, n=20, start_us=T0 + 60 * MINUTE, data_wait_us=1 * S, step_us=2 * S)
    chunk.framework = pa.concat_tables([chunk.framework, gen.table()])
    t = evaluate(Dataloader, chunk)["Details"]["dataloading_time"]
    expected = np.percentile(np.arange(1, 501) / 10_000, [25, 50, 95])
    assert [t["p25"], t["p50"], t["p95"]] == pytest.approx(expected.tolist())
    assert t["mode"] == TRAIN and t["count"] == 500 and t["max"] == 0.05
    assert sum(t["probs"]) == pytest.approx(1.0) and t["binedges"][0] == 0.0001 and t["binedges"][-1] == 0.05


def test_dataloader_not_applicable():
    no_fw = loader_run(4)
    no_fw.framework = no_fw.framework.slice(0, 0)
    out = evaluate(Dataloader, no_fw)
    assert out["Status"] == "not_applicable" and out["Datapoints"] == 0 and "no framework data" in out["Message"]
    gen = FwGen()
    gen.steps(n=20)  # steps, but the loop never iterated a DataLoader
    out = evaluate(Dataloader, whole(gen.table(), {}, run_info(node_info())))
    assert out["Status"] == "not_applicable" and "no DataLoader" in out["Message"]


def test_dataloader_bad_thresholds():
    with pytest.raises(ParameterError, match="min_threshold"):
        Dataloader(min_threshold=300, max_threshold=200)


def test_dataloader_chunk_invariance():
    assert_chunk_invariant(Dataloader, loader_run(5, waits_ms=np.arange(500) % 17), pieces=20)
    assert_chunk_invariant(Dataloader, loader_run(None, ranks=3, num_workers=1), pieces=20)


def test_a_tiny_model_on_in_memory_data_is_not_told_to_add_workers():
    """Half of a 0.5 ms step fetching an in-memory batch is no bottleneck a worker could remove: it fired."""
    gen = FwGen()
    gen.dataloader(rank=0, at_us=LOOP_START - 1 * S, num_workers=0, pin_memory=False)
    _, ends = gen.steps(rank=0, n=500, start_us=LOOP_START, step_us=500, data_wait_us=250, jitter_us=0)
    info = node_info(start_us=T0, end_us=int(ends[-1]) + 30 * S, cores=8, gpus=0)
    system = {"algo-1": snapshots("algo-1", T0, int(ends[-1]) + 30 * S, interval_us=10 * S, info=info,
                                  cpu__cpu_util=30)}
    out = evaluate(Dataloader, whole(gen.table(), system, run_info(info)))
    node = out["Details"]["nodes"]["algo-1"]
    assert node["wait_share"] > 40 and not node["triggered"] and node["reason"] == "not_a_bottleneck"
    assert evaluate(Dataloader, whole(gen.table(), system, run_info(info)), min_wait_ms=0.1
                    )["RuleTriggered"] == 1  # with a lower floor the same run fires


def test_each_loader_is_judged_by_the_loop_it_fed():
    """A starved training loop (loader 1, 2 workers, 2 cores) and an evaluation loop (loader 2, num_workers=0, more
    iterators): the loaders carry their mode and wait; the advice is about the training loader, and never the
    count it has (2 on 2 cores: `slow_fetch`, not `below` with "try num_workers=2")."""
    gen = FwGen()
    gen.dataloader(key=1, created_at="/job/train.py:40", name="Train", num_workers=2, loader_id="11", pin_memory=True)
    for i in range(5):
        gen.dataloader(key=2, created_at="/job/train.py:41", name="Val", num_workers=0, loader_id="12",
                       at_us=T0 + (i + 1) * S)
    _, ends = gen.steps(n=300, data_wait_us=50 * MS, jitter_us=0, loader=1)
    gen.steps(mode=EVAL, n=50, data_wait_us=80 * MS, jitter_us=0, loader=2, start_us=int(ends[-1]) + S)
    out = evaluate(Dataloader, whole(gen.table(), run=run_info(node_info(cores=2))))
    loaders = {e["created_at"]: e for e in out["Details"]["loaders"]}
    assert (loaders["/job/train.py:40"]["mode"], loaders["/job/train.py:41"]["mode"]) == (TRAIN, EVAL)
    assert loaders["/job/train.py:40"]["wait_s"] == pytest.approx(15.0)
    node = out["Details"]["nodes"]["algo-1"]
    assert node["triggered"] and node["reason"] == "slow_fetch" and node["num_workers"] == 2
    assert out["Details"]["num_workers"] == 2 and out["Details"]["pin_memory"] is True
    assert "num_workers=2" not in out["Recommendation"] and "not prefetched" not in out["Recommendation"]


def test_batches_faster_than_a_hand_over_are_not_called_a_small_wait():
    """0.4 ms steps waiting 0.12 ms each (30 %): above wait_threshold, but under min_wait_ms. The rule stays silent
    and says why, rather than "a typical step waited at most 30 % … no change needed"."""
    gen = FwGen()
    gen.dataloader(key=1, num_workers=0)
    gen.steps(n=3000, step_us=400, gap_us=0, data_wait_us=120, jitter_us=0, loader=1)
    out = evaluate(Dataloader, whole(gen.table(), run=run_info(node_info(cores=8))))
    assert not out["RuleTriggered"] and out["Details"]["median_wait_ms"] == pytest.approx(0.12)
    assert "0.12 ms" in out["Recommendation"] and "not a bottleneck" not in out["Recommendation"]
