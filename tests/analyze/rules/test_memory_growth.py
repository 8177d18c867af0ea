"""MemoryGrowth on generated steps that record their memory (`rss_kb`, `cuda_alloc_kb` in the step's args): a
planted leak fires with its rate and the limit it reaches; a warm-up that plateaus, and noise, stay silent; the
result is the same in one chunk or many, and merged node by node; the capture's sites name the line."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pytest

from stallwatch.analyze.memory import memory_columns, theil_sen
from stallwatch.analyze.rules.memory_growth import MemoryGrowth, MemoryGrowthDetails
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.records import GLOBAL, MEMORY_LIMIT, STEP, TRAIN

from ._fw_gen import MS, T0, FwGen, assert_chunk_invariant, evaluate, node_info, run_info, whole

GB_KB = 1024 * 1024


def _loop(kb_of_step, *, n: int = 600, node: str = "algo-1", rank: int = 0, cuda=None, seed: int = 0,
          gen: FwGen | None = None) -> FwGen:
    """`n` 10 ms TRAIN steps whose RSS (KiB) is `kb_of_step(step)` plus ±2 MB of noise (seeded); with `cuda`,
    the allocator's allocated KiB likewise."""
    gen = gen or FwGen()
    rng = np.random.default_rng(seed)
    for i in range(n):
        t = T0 + i * 11 * MS
        args = {"rss_kb": int(kb_of_step(i) + rng.integers(-2048, 2049))}
        if cuda is not None:
            args.update(cuda_alloc_kb=int(cuda(i)), cuda_reserved_kb=int(cuda(i)) + 4096, cuda_peak_kb=int(cuda(i)))
        gen.events(node, rank, STEP, "train_step", TRAIN, i, t, t + 10 * MS, json.dumps(args))
    return gen


def _run(gen: FwGen, machine_gb: float = 16.0):
    info = node_info()
    info["memory_total_bytes"] = int(machine_gb * 2**30)
    return whole(gen.table(), run=run_info(info))


def test_memory_is_read_from_the_steps_args_and_nothing_else():
    import pyarrow as pa

    table = pa.table({"node": ["a"] * 4, "rank": [0] * 4, "kind": [STEP, STEP, "forward", STEP], "mode": [TRAIN] * 4,
                      "step": [0, 1, 1, 2], "start_us": [0] * 4, "end_us": [1] * 4,
                      "args": ['{"runq_us": 3, "rss_kb": 100}', '{"rss_kb":7, "cuda_alloc_kb": 9}', '{"rss_kb": 5}',
                               '{"rss_kb": 9' + "9" * 30 + "}"]})
    cols = memory_columns(FrameworkColumns(table))
    assert cols["rss_kb"].tolist() == [100, 7, -1, -1] and cols["cuda_alloc_kb"].tolist() == [-1, 9, -1, -1]


def test_theil_sen_matches_scipy_and_ignores_outliers():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    x = np.arange(50.0)
    y = 2.5 * x + rng.normal(0, 1, 50)
    y[[5, 17, 33]] += 500
    assert theil_sen(x, y) == pytest.approx(stats.theilslopes(y, x)[0])
    assert theil_sen(x, y) == pytest.approx(2.5, abs=0.2)


def test_a_leak_fires_with_its_rate_and_when_it_reaches_the_machines_memory():
    out = assert_chunk_invariant(MemoryGrowth, _run(_loop(lambda i: 2 * GB_KB + 200 * i)))  # 200 KiB a step
    d = MemoryGrowthDetails.from_json(out["Details"])
    assert out["RuleTriggered"] == 1 and d.fired == ["algo-1/0:rss_kb"]
    g = d.series["algo-1/0:rss_kb"]
    assert g.rate_mb_per_1000 == pytest.approx(200 * 1000 / 1024, rel=0.05)
    assert g.since_step == 60 and g.limit_source == "machine" and g.limit_mb == 16 * 1024
    assert g.steps_to_limit == pytest.approx((16 * 1024 - g.last_mb) / g.rate_mb_per_1000 * 1000, rel=1e-3)
    assert not g.within_horizon and out["Details"]["time_at_stake_s"] is None  # 70,000 steps away
    assert "grows 195 MB per 1,000 steps on rank algo-1/0 since step 60" in d.title
    assert "machine limit (16.0 GB)" in d.title


def test_warm_up_that_plateaus_and_noise_stay_silent():
    warm = _loop(lambda i: GB_KB + 300 * min(i, 150))  # +44 MB over 150 steps, then flat
    out = evaluate(MemoryGrowth, _run(warm))
    assert out["RuleTriggered"] == 0 and out["Datapoints"] == 600, out["Details"]
    flat = evaluate(MemoryGrowth, _run(_loop(lambda i: GB_KB, seed=5)))
    assert flat["RuleTriggered"] == 0
    assert abs(flat["Details"]["series"]["algo-1/0:rss_kb"]["rate_mb_per_1000"]) < 5


def _captured(kb_of_step, windows=((150, 179), (300, 329), (450, 479)), inside_kb: int = 4 * 1024,
              left_kb: int = 20 * 1024, layer: str = "detailed") -> FwGen:
    """`_loop` with profiling captures over steps (first, last) of `windows` (time windows, as escalations': no step
    numbers in their events): through each, RSS rises `inside_kb`, then steps up `left_kb` at its last step and
    stays up (the profiler's buffers the allocator keeps), as torch.profiler captures did on a real job."""
    def kb(i: int) -> float:
        up = 0.0
        for first, last in windows:
            up += min(max(i - first, 0), last - first) * inside_kb / (last - first) + (left_kb if i >= last else 0)
        return kb_of_step(i) + up

    gen = _loop(kb)
    for first, last in windows:
        start, end = T0 + first * 11 * MS, T0 + last * 11 * MS + 10 * MS + 500  # its event comes when it stops
        gen.events("algo-1", 0, "profiling", layer, GLOBAL, None, start, end,
                   json.dumps({"window": f"{layer}-{start:016d}", "first_step": None, "last_step": None,
                               "status": "complete"}))
    return gen


def test_the_memory_profiling_captures_leave_is_not_a_leak():
    """The captures' steps and the first window after each are left out and the series is cut there: the steps up
    are no slope. Without the captures' events the same steps fire (the false finding seen beside CPU hogs, where
    the planted-stalls job of test_escalation.py was captured for three rules in turn)."""
    flat = _captured(lambda i: GB_KB)
    out = assert_chunk_invariant(MemoryGrowth, _run(flat))
    g = MemoryGrowthDetails.from_json(out["Details"]).series["algo-1/0:rss_kb"]
    assert out["RuleTriggered"] == 0 and g.captures == 3 and g.left_out == 3 * 3, g
    assert abs(g.rate_mb_per_1000) < 5 and g.windows == 27 - 9
    table = flat.table()
    unmarked = table.filter(pc.not_equal(table["kind"], "profiling"))
    before = evaluate(MemoryGrowth, whole(unmarked, run=_run(flat).run))  # what it read before
    assert before["RuleTriggered"] == 1, before["Details"]["series"]
    for layer in ("python", "memory"):
        assert evaluate(MemoryGrowth, _run(_captured(lambda i: GB_KB, layer=layer)))["RuleTriggered"] == 0
    timing = evaluate(MemoryGrowth, _run(_captured(lambda i: GB_KB, layer="dataloader")))  # no profiler memory
    assert timing["Details"]["series"]["algo-1/0:rss_kb"]["left_out"] == 0


def test_a_capture_under_way_is_left_out_before_it_ends():
    """Evaluated live while a capture runs (its beginning recorded, its end not yet): the profiler's memory rising
    through the capture's steps is not the job's. Without the beginning those steps read as a leak; once the
    capture's own event is in, it is judged as any ended capture."""
    def begun(start_step: int, n: int) -> FwGen:
        gen = _loop(lambda i: GB_KB + max(i - start_step, 0) * 600, n=n)
        start = T0 + start_step * 11 * MS
        gen.events("algo-1", 0, "profiling", "memory", GLOBAL, None, start, start,
                   json.dumps({"window": f"memory-{start:016d}", "status": "started"}))
        return gen

    live = begun(240, 400)
    out = assert_chunk_invariant(MemoryGrowth, _run(live))
    g = MemoryGrowthDetails.from_json(out["Details"]).series["algo-1/0:rss_kb"]
    assert out["RuleTriggered"] == 0 and g.left_out >= 8, g
    table = live.table()
    unmarked = evaluate(MemoryGrowth, whole(table.filter(pc.not_equal(table["kind"], "profiling")),
                                            run=_run(live).run))
    assert unmarked["RuleTriggered"] == 1, unmarked["Details"]["series"]
    ended = begun(240, 400)
    start = T0 + 240 * 11 * MS
    ended.events("algo-1", 0, "profiling", "memory", GLOBAL, None, start, T0 + 399 * 11 * MS + 10 * MS,
                 json.dumps({"window": f"memory-{start:016d}", "first_step": 240, "last_step": 399,
                             "status": "complete"}))
    g = MemoryGrowthDetails.from_json(evaluate(MemoryGrowth, _run(ended))["Details"]).series["algo-1/0:rss_kb"]
    assert g.captures == 0 and g.left_out >= 8, g  # the same steps left out, by the capture's own window now


def test_a_leak_across_captures_still_fires_at_its_rate():
    """A leak grows between captures (and through them): the slope within each stretch is the leak's."""
    out = assert_chunk_invariant(MemoryGrowth, _run(_captured(lambda i: 2 * GB_KB + 200 * i)))
    g = MemoryGrowthDetails.from_json(out["Details"]).series["algo-1/0:rss_kb"]
    assert out["RuleTriggered"] == 1 and g.captures == 3
    assert g.rate_mb_per_1000 == pytest.approx(200 * 1000 / 1024, rel=0.05)
    assert g.late_rate_mb_per_1000 == pytest.approx(200 * 1000 / 1024, rel=0.1)


def test_a_cuda_leak_reaches_the_gpu_limit_within_the_runs_horizon():
    gen = _loop(lambda i: GB_KB, cuda=lambda i: 70 * GB_KB + 100 * 1024 * i)  # +100 MB a step on an 80 GB GPU
    gen.events("algo-1", 0, MEMORY_LIMIT, "gpu", GLOBAL, None, T0, T0, json.dumps({"bytes": 80 * 2**30, "device": 0}))
    out = assert_chunk_invariant(MemoryGrowth, _run(gen))
    d = MemoryGrowthDetails.from_json(out["Details"])
    assert d.fired == ["algo-1/0:cuda_alloc_kb"]
    g = d.series["algo-1/0:cuda_alloc_kb"]
    assert g.limit_source == "gpu" and g.within_horizon and d.time_at_stake_s == pytest.approx(6.0)
    assert "GPU memory allocated grows" in d.title and "gpu limit (80.0 GB)" in d.title


def test_the_capture_names_the_line_and_the_cgroup_limit_is_the_tighter():
    gen = _loop(lambda i: 2 * GB_KB + 200 * i)
    gen.events("algo-1", 0, MEMORY_LIMIT, "cgroup", GLOBAL, None, T0, T0, json.dumps({"bytes": 3 * 2**30}))
    sites = {"steps": [300, 305], "grown_kb": 1000.0, "cost_ms": 12.5,
             "sites": [{"file": "/job/train.py", "line": 42, "size_kb": 990.0, "count": 5,
                        "traceback": ["/job/train.py:60", "/job/train.py:42"]}, {"file": 7}]}
    gen.events("algo-1", 0, "memory_sites", "tracemalloc", GLOBAL, None, T0 + 4 * 10**6, T0 + 4 * 10**6,
               json.dumps(sites))
    out = evaluate(MemoryGrowth, _run(gen))
    d = MemoryGrowthDetails.from_json(out["Details"])
    g = d.series["algo-1/0:rss_kb"]
    assert g.limit_source == "cgroup" and g.limit_mb == 3 * 1024
    assert d.captures[0].sites[0].where == "/job/train.py:42" and len(d.captures[0].sites) == 1
    assert d.title.endswith("allocated at /job/train.py:42")
    assert "/job/train.py:42 (+1.0 MB)" in out["Recommendation"]


def test_merged_node_by_node_as_fed_whole():
    gen = _loop(lambda i: 2 * GB_KB + 200 * i)
    _loop(lambda i: GB_KB, node="algo-2", gen=gen, seed=9)
    chunk = _run(gen)
    whole_result = evaluate(MemoryGrowth, chunk)
    merged = MemoryGrowth()
    for node in ("algo-1", "algo-2"):
        part = MemoryGrowth()
        mask = np.asarray(chunk.framework["node"].to_pylist()) == node
        part.update(whole(chunk.framework.filter(mask), run=chunk.run))
        merged.merge(part, node)
    assert json.dumps(merged.result().to_json(), sort_keys=True) == json.dumps(whole_result, sort_keys=True)
    assert whole_result["Details"]["fired"] == ["algo-1/0:rss_kb"]


def test_a_run_without_memory_readings_is_not_applicable():
    gen = FwGen()
    gen.steps(n=50)
    out = evaluate(MemoryGrowth, whole(gen.table()))
    assert out["Status"] == "not_applicable" and "do not record memory" in out["Message"]


def _ended(chunk, **end):
    for rec in chunk.run["nodes"].values():
        rec.update(end)
    return chunk


def test_a_cuda_out_of_memory_death_on_recorded_allocator_data():
    """As a CUDA job records it: allocated grows 100 MB a step, then OutOfMemoryError at exit (recorded data)."""
    gen = _loop(lambda i: GB_KB, cuda=lambda i: 20 * GB_KB + 100 * 1024 * i)
    state = {"error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                      "of 79.19 GiB of which 1.2 GiB is free.", "rss_kb": GB_KB,
             "cuda": {"device": 0, "allocated_kb": 78 * GB_KB, "reserved_kb": 79 * GB_KB, "peak_kb": 78 * GB_KB,
                      "total_kb": 80 * GB_KB, "at_failure": {"device": 0, "tried_kb": 2 * GB_KB}}}
    gen.events("algo-1", 0, "oom", "cuda", GLOBAL, None, T0 + 7 * 10**6, T0 + 7 * 10**6, json.dumps(state))
    out = evaluate(MemoryGrowth, _ended(_run(gen), exit_code=1, exit_signal=None))
    death = MemoryGrowthDetails.from_json(out["Details"]).death
    assert death is not None and death.kind == "cuda" and (death.at_mb, death.limit_mb) == (78 * 1024, 80 * 1024)
    assert death.head == "ran out of GPU memory (OutOfMemoryError: CUDA out of memory) at 78.0 GB allocated of a " \
                         "80.0 GB GPU"
    assert death.growth == "memory grew 100,000 MB per 1,000 steps since step 60"
    succeeded = evaluate(MemoryGrowth, _ended(_run(gen), exit_code=0, exit_signal=None))  # caught by the job
    assert succeeded["Details"]["death"] is None


def test_a_sigkill_near_the_limit_reads_as_the_oom_killer_and_far_from_it_does_not():
    near = _loop(lambda i: 14 * GB_KB + 2048 * i)  # reaches 15.2 GB of 16 GB
    out = evaluate(MemoryGrowth, _ended(_run(near), exit_code=137, exit_signal="SIGKILL"))
    death = out["Details"]["death"]
    assert death["kind"] == "sigkill_near_limit" and "most likely by the out-of-memory killer" in death["head"]
    counted = evaluate(MemoryGrowth, _ended(_run(near), exit_code=137, exit_signal="SIGKILL", oom_kills=1,
                                            memory_limit_bytes=15 * 2**30, memory_peak_bytes=15 * 2**30 - 2**20))
    assert counted["Details"]["death"]["head"] == "was killed by the out-of-memory killer at 15.0 GB of a 15.0 GB limit"
    far = evaluate(MemoryGrowth, _ended(_run(_loop(lambda i: GB_KB + 200 * i)), exit_code=137, exit_signal="SIGKILL"))
    assert far["Details"]["death"] is None
