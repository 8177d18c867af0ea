"""CommunicationBound on generated framework events with planted patterns: a step that waits for its gradient
all-reduce fires with its bytes, bandwidth and the job's DDP settings in the advice; a compute-bound one, or one
rank waiting for a slower one (Straggler's finding), is silent; DDP's sampled averages stand in where the host
cannot time each step (CUDA); one chunk or many give the same result."""

from __future__ import annotations

import json

import pytest

from stallwatch.analyze.rules.communication import CommunicationBound, CommunicationDetails
from stallwatch.records import COLLECTIVE, TRAIN

from ._fw_gen import MS, FwGen, assert_chunk_invariant, evaluate, node_info, run_info, whole

MB17 = 17_326_084
DDP = {"bytes": MB17, "params": 6, "device_type": "cpu", "world_size": 2, "backend": "gloo", "bucket_cap_mb": 25.0,
       "gradient_as_bucket_view": False, "find_unused_parameters": False, "static_graph": False}


def _ddp_job(gen: FwGen, *, rank: int, exposed_ms: float | list[float], node: str = "algo-1", n: int = 300,
             every: int = 1, step_ms: int = 100, config: dict | None = None) -> None:
    """DDP steps of `step_ms` whose backward ends with `exposed_ms` of waiting for the all-reduce (one
    `ddp_gradient_sync` event per step that reduced: every `every`th, the others under no_sync)."""
    starts, ends = gen.steps(node=node, rank=rank, n=n, step_us=step_ms * MS, jitter_us=0, data_wait_us=0)
    exposed = exposed_ms if isinstance(exposed_ms, list) else [exposed_ms] * n
    for i in range(0, n, every):
        end = int(starts[i]) + int(0.9 * step_ms * MS)  # backward returns before the optimizer's 10 %
        gen.events(node, rank, COLLECTIVE, "ddp_gradient_sync", TRAIN, i, end - int(exposed[i] * MS), end,
                   args=json.dumps({"bytes": MB17}))
    gen.events(node, rank, "ddp", "DistributedDataParallel", "GLOBAL", None, int(starts[0]) - 1,
               int(starts[0]) - 1, args=json.dumps(config or DDP))


def _details(out: dict) -> CommunicationDetails:
    return CommunicationDetails.from_json(out["Details"])


def test_a_step_waiting_for_its_all_reduce_fires():
    """Planted: both ranks wait 40 ms of each 100 ms step for 17.3 MB of gradients."""
    gen = FwGen()
    for rank in (0, 1):
        _ddp_job(gen, rank=rank, exposed_ms=40)
    out = assert_chunk_invariant(CommunicationBound, whole(gen.table()))
    d = _details(out)
    assert (out["RuleTriggered"], out["Datapoints"], out["Violations"]) == (2, 580, 6)  # windows of 100 after 10
    top = d.top
    assert top is not None and top.source == "measured" and top.triggered
    # the typical exposed time per window (its lower quartile, from a histogram of 4.4 % bins): within 3 %
    assert top.share == pytest.approx(40.0, rel=0.03) and top.exposed_ms == pytest.approx(40.0, rel=0.03)
    assert top.exposed_s == pytest.approx(0.04 * 290)  # the rank's own measured sum, exactly
    assert top.bytes_per_step == MB17 and top.bandwidth_gbps == pytest.approx(MB17 * 8 / 0.04 / 1e9, rel=0.03)
    assert top.comm_s == pytest.approx(0.04 * 290, rel=0.03) and top.wait_s == pytest.approx(0.0, abs=0.4)
    assert d.time_at_stake_s == pytest.approx(top.comm_s)
    assert out["Details"]["title"] == "Training waits for the gradient all-reduce up to 40 % of the time on 2 ranks"
    advice = out["Recommendation"]
    for words in ("no_sync", "bucket_cap_mb` (now 25)", "gradient_as_bucket_view=True", "ZeroRedundancyOptimizer",
                  "17.3 MB", "one machine"):
        assert words in advice, words


@pytest.mark.parametrize("exposed_ms, fires", [(2, False), (19, False), (21, True)])
def test_the_threshold(exposed_ms, fires):
    """A compute-bound DDP step (2 ms of a 100 ms step exposed) is silent; over 20 % of the step fires."""
    gen = FwGen()
    for rank in (0, 1):
        _ddp_job(gen, rank=rank, exposed_ms=exposed_ms)
    out = evaluate(CommunicationBound, whole(gen.table()))
    assert out["Status"] == "ok" and bool(out["RuleTriggered"]) is fires
    assert evaluate(CommunicationBound, whole(gen.table()), threshold=exposed_ms - 1)["RuleTriggered"] == 2


def test_waiting_for_a_slower_rank_is_not_communication():
    """Planted: rank 0 waits 40 ms in the all-reduce because rank 1 arrives 38 ms late (rank 1 itself waits 2 ms):
    Straggler's finding, not this one; the wait is said apart."""
    gen = FwGen()
    _ddp_job(gen, rank=0, exposed_ms=40)
    _ddp_job(gen, rank=1, exposed_ms=2)
    out = evaluate(CommunicationBound, whole(gen.table()))
    d = _details(out)
    assert out["RuleTriggered"] == 0
    r0 = next(r for r in d.ranks if r.rank == 0)
    assert r0.exposed_s == pytest.approx(0.04 * 290) and r0.comm_s == pytest.approx(0.002 * 290, rel=0.03)
    assert r0.wait_s == pytest.approx(0.038 * 290, rel=0.03) and r0.share == pytest.approx(2.0, rel=0.03)


def test_a_tail_of_steps_held_up_by_the_machine_is_not_the_transfer():
    """Planted: 2 ms a step to reduce, but one step in three held up 30 ms more (a busy machine: the gloo threads
    wait for a CPU). The mean would read 32 % of the step; the typical step (the lower quartile) says 2 %."""
    gen = FwGen()
    for rank in (0, 1):
        _ddp_job(gen, rank=rank, exposed_ms=[32.0 if i % 3 == 0 else 2.0 for i in range(300)])
    out = evaluate(CommunicationBound, whole(gen.table()))
    top = _details(out).top
    assert out["RuleTriggered"] == 0 and top is not None
    assert top.exposed_s == pytest.approx(0.012 * 290, rel=0.02) and top.share == pytest.approx(2.0, rel=0.03)


def test_no_sync_accumulation_counts_the_steps_that_reduced():
    """Planted: gradient accumulation under no_sync, one step in 4 reduces and waits 100 ms (of 4 × 100 ms)."""
    gen = FwGen()
    for rank in (0, 1):
        _ddp_job(gen, rank=rank, exposed_ms=[80.0] * 400, n=400, every=4)
    d = _details(evaluate(CommunicationBound, whole(gen.table())))
    top = d.top
    assert top is not None and top.synced_steps == pytest.approx(390 / 4, abs=1)
    assert top.exposed_ms == pytest.approx(80.0, rel=0.03) and top.share == pytest.approx(20.0, rel=0.03)


def test_ddp_samples_stand_in_where_steps_are_not_timed():
    """A CUDA job: no per-step events, DDP's own averages (50 ms of all-reduce, 10 ms hidden) → 40 ms exposed."""
    gen = FwGen()
    for rank in (0, 1):
        starts, _ = gen.steps(rank=rank, n=300, step_us=100 * MS, jitter_us=0, data_wait_us=0)
        args = {"iteration": 200, "avg_backward_comm_time_us": 50_000.0,
                "avg_backward_compute_comm_overlap_time_us": 10_000.0, "avg_backward_compute_time_us": 30_000.0}
        gen.events("algo-1", rank, COLLECTIVE, "ddp_gradient_all_reduce", TRAIN, None, int(starts[200]),
                   int(starts[200]) + 50 * MS, args=json.dumps(args))
        gen.events("algo-1", rank, "ddp", "DistributedDataParallel", "GLOBAL", None, int(starts[0]),
                   int(starts[0]), args=json.dumps({**DDP, "device_type": "cuda"}))
    out = evaluate(CommunicationBound, whole(gen.table()))
    top = _details(out).top
    assert out["RuleTriggered"] == 2 and top is not None and top.source == "ddp_samples"
    assert top.exposed_ms == pytest.approx(40.0) and top.total_ms == pytest.approx(50.0)
    assert top.hidden_pct == pytest.approx(20.0) and top.bytes_per_step == MB17


def test_the_loops_own_collectives_count_and_the_link_is_compared():
    """No DDP: the loop all-reduces its gradients itself (60 ms a step, 40 MB) on two nodes with 10 Gb/s NICs."""
    gen = FwGen()
    for node in ("algo-1", "algo-2"):
        starts, _ = gen.steps(node=node, rank=0 if node == "algo-1" else 1, n=200, step_us=100 * MS, jitter_us=0,
                              data_wait_us=0)
        gen.events(node, 0 if node == "algo-1" else 1, COLLECTIVE, "all_reduce", TRAIN, list(range(200)),
                   starts + 30 * MS, starts + 90 * MS, args=json.dumps({"bytes": 40_000_000, "async": False}))
    nodes = [dict(node_info(n), nics=[{"name": "eth0", "speed_mbps": 10_000}]) for n in ("algo-1", "algo-2")]
    out = evaluate(CommunicationBound, whole(gen.table(), run=run_info(*nodes)))
    d = _details(out)
    assert out["RuleTriggered"] == 2 and not d.single_node
    assert {n.link_gbps for n in d.nodes} == {10.0}
    top = d.top
    assert top is not None and top.source == "collectives"
    assert top.bandwidth_gbps == pytest.approx(40e6 * 8 / 0.06 / 1e9, rel=0.03)
    assert "of node algo-" in out["Recommendation"] and "Gb/s link" in out["Recommendation"]
    assert out["Details"]["title"].startswith("Training waits for collectives")


def test_not_applicable_without_collectives_and_bad_parameters():
    gen = FwGen()
    gen.steps(n=50)
    out = evaluate(CommunicationBound, whole(gen.table()))
    assert out["Status"] == "not_applicable" and "no collective" in out["Message"]
    assert evaluate(CommunicationBound, whole())["Status"] == "not_applicable"
    from stallwatch.analyze.rules.base import ParameterError

    with pytest.raises(ParameterError):
        CommunicationBound(threshold=150)
    with pytest.raises(ParameterError):
        CommunicationBound(window=0)


def test_by_node_merge_equals_one_feed():
    """Each node fed on its own and merged (the Dask path) ends as one feed of the whole run."""
    gen = FwGen()
    _ddp_job(gen, rank=0, exposed_ms=40, node="algo-1")
    _ddp_job(gen, rank=1, exposed_ms=35, node="algo-2")
    table = gen.table()
    one = evaluate(CommunicationBound, whole(table))
    import pyarrow.compute as pc

    merged = CommunicationBound()
    for node in ("algo-1", "algo-2"):
        part = CommunicationBound()
        part.update(whole(table.filter(pc.equal(table["node"], node))))
        merged.merge(part, node)
    assert json.dumps(merged.result().to_json(), sort_keys=True) == json.dumps(one, sort_keys=True)
