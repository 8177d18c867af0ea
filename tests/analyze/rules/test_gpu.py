"""LowGPUUtilization, BatchSize, GPUMemoryIncrease and LoadBalancing on generated nodes with planted
patterns (see _gen.py): each threshold from both sides, partial windows, several nodes, CPU-only runs,
and one chunk vs many."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stallwatch.analyze.rules.base import ParameterError
from stallwatch.analyze.rules.batch_size import BatchSize
from stallwatch.analyze.rules.gpu_memory_increase import GPUMemoryIncrease
from stallwatch.analyze.rules.load_balancing import js_distance, LoadBalancing
from stallwatch.analyze.rules.low_gpu_utilization import LowGPUUtilization
from tests.analyze.rules import _gen as g

PATIENCE, WINDOW = 100, 100
N = PATIENCE + 10 * WINDOW  # ten whole windows after patience


def _window(k: int) -> tuple[int, int]:
    """Snapshot range of evaluated window k."""
    return PATIENCE + k * WINDOW, PATIENCE + (k + 1) * WINDOW


GPU_RULES = [LowGPUUtilization, BatchSize, GPUMemoryIncrease, LoadBalancing]


# -- shared -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule_cls", GPU_RULES)
def test_cpu_only_run_is_not_applicable(rule_cls):
    """Pattern: two CPU-only nodes (no gpuN columns)."""
    c = g.chunk(g.make_node("algo-1", n=N, gpus=0), g.make_node("algo-2", n=N, gpus=0, seed=1))
    out = g.run(rule_cls(patience=PATIENCE), c)
    assert out["Status"] == "not_applicable"
    assert out["Datapoints"] == out["RuleTriggered"] == out["Violations"] == 0
    assert "algo-1, algo-2" in out["Message"] and out["Details"]["reason"] == out["Message"]


@pytest.mark.parametrize("rule_cls", GPU_RULES)
def test_healthy_node_never_fires(rule_cls):
    """Pattern: none (GPUs busy at 80 %, flat memory, moderate CPU)."""
    out = g.run(rule_cls(patience=PATIENCE), g.chunk(g.make_node(n=N)))
    assert out["Status"] == "ok"
    assert out["RuleTriggered"] == out["Violations"] == 0
    assert out["Recommendation"] == rule_cls.recommendation
    assert out["Datapoints"] == N - PATIENCE


@pytest.mark.parametrize("rule_cls", [LowGPUUtilization, BatchSize, GPUMemoryIncrease])
def test_bad_window_is_a_clear_error(rule_cls):
    with pytest.raises(ParameterError, match="window"):
        rule_cls(window=0)


@pytest.mark.parametrize("rule_cls", GPU_RULES)
def test_one_chunk_and_many_chunks_agree(rule_cls):
    """Pattern: everything at once on two nodes with different starts and a partial last window:
    a fluctuating and an underutilized GPU, a small batch, memory steps, an idle GPU."""
    a = g.make_node("algo-1", n=N + 37, gpus=3)
    b = g.make_node("algo-2", n=N + 150, gpus=2, start_us=g.START_US + 13 * g.INTERVAL_US + 999, seed=4)
    g.plant_fluctuation(a, 1, *_window(2))
    g.plant_gpu_util(a, 0, _window(4)[0], _window(6)[0] + 50, 20.0)
    g.plant_small_batch(a, *_window(7))
    g.plant_memory_step(a, 2, _window(3)[0], 12.0)
    g.plant_memory_step(b, 0, _window(5)[0] + 3, 30.0)
    g.plant_gpu_util(b, 1, PATIENCE, N + 150, 3.0)
    g.plant_gpu_util(a, 2, N, N + 37, 1.0)  # only the partial window
    params = {"patience": PATIENCE} if rule_cls is LoadBalancing else {"patience": PATIENCE, "window": WINDOW}
    if rule_cls is GPUMemoryIncrease:
        params["window"] = 10
    out = g.assert_chunk_invariant(rule_cls, g.chunk(a, b), params)
    assert out["RuleTriggered"] > 0


def test_columns_appearing_later_read_as_missing():
    """Pattern: a GPU whose column is absent from the first chunks (live, before it reported) and NaN
    there in the whole-run frame: same result."""
    frame = g.make_node(n=N, gpus=2)
    g.plant_gpu_util(frame, 1, *_window(8), 5.0)
    whole = g.chunk(frame)
    first, rest = g.split_by_time(whole, [int(frame.timestamps[PATIENCE + 250])])
    del first.system["algo-1"].columns[g.col("gpu1", "gpu_util")]
    frame.columns[g.col("gpu1", "gpu_util")][: PATIENCE + 250] = np.nan
    for rule_cls in (LowGPUUtilization, BatchSize, LoadBalancing):
        params = {"patience": PATIENCE} if rule_cls is LoadBalancing else {"patience": PATIENCE, "window": WINDOW}
        assert g.as_text(g.run(rule_cls(**params), [first, rest])) == g.as_text(g.run(rule_cls(**params), whole))


# -- LowGPUUtilization --------------------------------------------------------------------------------


def _low(frame, final=True, **params):
    return g.run(LowGPUUtilization(**{"patience": PATIENCE, "window": WINDOW, **params}), g.chunk(frame, final=final))


@pytest.mark.parametrize("p95, flagged", [(69.0, 1), (71.0, 0)])
def test_low_gpu_underutilized_on_both_sides_of_threshold_p95(p95, flagged):
    """Pattern: gpu0 flat at 69 % (underutilized) or 71 % (fine) during window 3."""
    frame = g.make_node(n=N)
    g.plant_gpu_util(frame, 0, *_window(3), p95)
    out = _low(frame)
    gpu0 = out["Details"]["algo-1"]["gpu0"]
    assert out["Violations"] == out["RuleTriggered"] == gpu0["underutilized"] == flagged
    assert gpu0["fluctuating"] == 0
    assert gpu0["windows"] == 10 and out["Datapoints"] == 10 * WINDOW
    if flagged:
        assert gpu0["case"] == "underutilized" and gpu0["lowest_window_p95"] == 69.0
        assert gpu0["last_timestamp"] == int(frame.timestamps[_window(3)[1] - 1])
        assert out["Details"]["last_timestamp"] == gpu0["last_timestamp"]
        assert "gpu0 on node algo-1 was underutilized in 1 of 10 windows" in out["Recommendation"]
    else:
        assert gpu0["case"] is None and out["Details"]["last_timestamp"] is None


@pytest.mark.parametrize("low, flagged", [(9.0, 1), (11.0, 0)])
def test_low_gpu_fluctuating_on_both_sides_of_threshold_p5(low, flagged):
    """Pattern: gpu1 at 95 % dropping to `low` every 4th snapshot in window 5 (p95 95 %, p5 = low)."""
    frame = g.make_node(n=N)
    g.plant_fluctuation(frame, 1, *_window(5), high=95.0, low=low)
    out = _low(frame)
    gpu1 = out["Details"]["algo-1"]["gpu1"]
    assert (out["Violations"], gpu1["fluctuating"], gpu1["underutilized"]) == (flagged, flagged, 0)
    assert gpu1["case"] == ("fluctuating" if flagged else None)


def test_low_gpu_triggered_counts_windows_violations_count_gpus():
    """Pattern: both GPUs low in window 1 (one window, two GPUs), gpu0 low in window 2 as well."""
    frame = g.make_node(n=N)
    g.plant_gpu_util(frame, 0, _window(1)[0], _window(2)[1], 30.0)
    g.plant_gpu_util(frame, 1, *_window(1), 30.0)
    out = _low(frame)
    assert out["RuleTriggered"] == 2 and out["Violations"] == 3


def test_low_gpu_lists_its_flagged_windows_with_their_gpus():
    """Pattern as above: both GPUs low in window 1, gpu0 in window 2 — two windows listed, with their GPUs and
    the times of their first and last snapshots (what the report's timeline draws)."""
    frame = g.make_node(n=N)
    g.plant_gpu_util(frame, 0, _window(1)[0], _window(2)[1], 30.0)
    g.plant_gpu_util(frame, 1, *_window(1), 30.0)
    flagged = _low(frame)["Details"]["flagged_windows"]
    ts = frame.timestamps
    assert flagged["total"] == 2
    assert flagged["windows"] == [
        {"node": "algo-1", "start_us": int(ts[_window(1)[0]]), "end_us": int(ts[_window(1)[1] - 1]),
         "devices": ["gpu0", "gpu1"]},
        {"node": "algo-1", "start_us": int(ts[_window(2)[0]]), "end_us": int(ts[_window(2)[1] - 1]),
         "devices": ["gpu0"]}]


def test_flagged_windows_are_capped_but_counted():
    from stallwatch.analyze.rules.gpu_memory_increase import GPUMemoryIncrease
    from stallwatch.analyze.rules.kit.windows import MAX_WINDOWS

    frame = g.make_node(n=PATIENCE + 10 * (MAX_WINDOWS + 20))
    memory = frame.columns["gpu0/gpu_mem_util"]
    memory[PATIENCE:] = 10.0 + 0.6 * (np.arange(len(memory) - PATIENCE) // 10)  # +0.6 points every window of 10
    out = g.run(GPUMemoryIncrease(patience=PATIENCE, increase=0.5), g.chunk(frame))
    flagged = out["Details"]["flagged_windows"]
    assert flagged["total"] == out["RuleTriggered"] == MAX_WINDOWS + 19  # every window but the first
    assert len(flagged["windows"]) == MAX_WINDOWS and flagged["windows"][0]["devices"] == ["gpu0"]


def test_low_gpu_details_are_whole_run_statistics():
    frame = g.make_node(n=N)
    g.plant_gpu_util(frame, 0, *_window(0), 0.0)
    gpu0 = _low(frame)["Details"]["algo-1"]["gpu0"]
    v = frame.columns["gpu0/gpu_util"][PATIENCE:]
    assert gpu0["gpu_max"] == v.max()
    assert gpu0["gpu_95"] == pytest.approx(np.percentile(v, 95)) and gpu0["p95"] == gpu0["gpu_95"]
    assert gpu0["gpu_5"] == pytest.approx(np.percentile(v, 5))
    assert gpu0["p50"] == pytest.approx(np.percentile(v, 50))


def test_low_gpu_partial_last_window_only_when_final():
    """Pattern: gpu0 idle during the last 50 snapshots, which do not fill a window."""
    frame = g.make_node(n=N + 50)
    g.plant_gpu_util(frame, 0, N, N + 50, 2.0)
    live = _low(frame, final=False)
    assert live["Datapoints"] == 10 * WINDOW and live["Violations"] == 0
    done = _low(frame, final=True)
    assert done["Datapoints"] == 10 * WINDOW + 50 and done["Violations"] == 1
    assert done["Details"]["algo-1"]["gpu0"]["windows"] == 11
    # live, with the end arriving in a final chunk of its own, is the same as batch
    early, late = g.split_by_time(g.chunk(frame), [int(frame.timestamps[N - 20])])
    rule = LowGPUUtilization(patience=PATIENCE, window=WINDOW)
    assert g.as_text(g.run(rule, [early, late])) == g.as_text(done)


def test_low_gpu_several_nodes():
    """Pattern: gpu1 of algo-2 underutilized in all its windows; algo-1 healthy; cpu-1 without GPUs."""
    a, b = g.make_node("algo-1", n=N), g.make_node("algo-2", n=N, seed=1)
    g.plant_gpu_util(b, 1, 0, N, 40.0)
    out = g.run(LowGPUUtilization(patience=PATIENCE, window=WINDOW),
                g.chunk(a, b, g.make_node("cpu-1", n=N, gpus=0)))
    assert out["Violations"] == out["RuleTriggered"] == 10
    assert out["Details"]["algo-2"]["gpu1"]["underutilized"] == 10
    assert out["Details"]["algo-1"]["gpu1"]["underutilized"] == 0
    assert out["Datapoints"] == 2 * 10 * WINDOW
    assert out["Details"]["not_applicable"] == {"cpu-1": "no GPU data recorded on node cpu-1"}


# -- BatchSize ----------------------------------------------------------------------------------------


def _batch(frame, **params):
    return g.run(BatchSize(**{"patience": PATIENCE, "window": WINDOW, **params}), g.chunk(frame))


@pytest.mark.parametrize("which", ["cpu", "gpu", "gpu_mem"])
@pytest.mark.parametrize("value, flagged", [(69.0, 1), (71.0, 0)])
def test_batch_size_each_threshold_from_both_sides(which, value, flagged):
    """Pattern: a small batch during window 4 (CPU 20 %, GPUs 30 %, GPU memory 20 %), with one of the
    three raised to 69 % (still below 70: flagged) or 71 % (not)."""
    frame = g.make_node(n=N)
    kw = {"cpu": 20.0, "gpu": 30.0, "gpu_mem": 20.0}
    kw[which] = value
    g.plant_small_batch(frame, *_window(4), **kw)
    out = _batch(frame)
    assert out["Violations"] == out["RuleTriggered"] == flagged
    node = out["Details"]["algo-1"]
    assert node["windows"] == 10 and node["violations"] == flagged
    assert node["last_timestamp"] == (int(frame.timestamps[_window(4)[1] - 1]) if flagged else None)
    assert out["Details"]["last_timestamp"] == node["last_timestamp"]
    if flagged:
        assert out["Recommendation"].startswith("node algo-1: 1 of 10 windows had low CPU, GPU and GPU memory")


def test_batch_size_needs_one_gpu_low_in_both_utilization_and_memory():
    """Pattern: CPU low; gpu0 utilization low but memory high, gpu1 memory low but utilization high:
    no GPU is low in both -> not flagged; then gpu1 low in both -> flagged."""
    frame = g.make_node(n=N)
    a, b = _window(2)
    g.set_values(frame, "cpu/cpu_util", a, b, 10.0)
    g.set_values(frame, "gpu0/gpu_util", a, b, 10.0)
    g.set_values(frame, "gpu0/gpu_mem_util", a, b, 90.0)
    g.set_values(frame, "gpu1/gpu_mem_util", a, b, 10.0)
    assert _batch(frame)["Violations"] == 0
    g.set_values(frame, "gpu1/gpu_util", a, b, 10.0)
    assert _batch(frame)["Violations"] == 1


def test_batch_size_details_box_stats_per_series():
    """Memory box plots come from memory alone (the fix), utilization from utilization."""
    frame = g.make_node(n=N)
    g.set_values(frame, "gpu1/gpu_mem_util", PATIENCE, N, np.linspace(0, 60, N - PATIENCE))
    node = _batch(frame)["Details"]["algo-1"]
    assert list(node)[:5] == ["cpu", "gpu0", "gpu0_memory", "gpu1", "gpu1_memory"]
    mem = frame.columns["gpu1/gpu_mem_util"][PATIENCE:]
    p25, p50, p75, p95 = np.percentile(mem, [25, 50, 75, 95])
    assert node["gpu1_memory"]["p50"] == pytest.approx(p50, abs=1e-3)
    assert node["gpu1_memory"]["upper"] == pytest.approx(min(p75 + 1.5 * (p75 - p25), mem.max()), abs=1e-3)
    util = frame.columns["gpu1/gpu_util"][PATIENCE:]
    assert node["gpu1"]["p95"] == pytest.approx(np.percentile(util, 95))
    assert node["cpu"]["p75"] == pytest.approx(np.percentile(frame.columns["cpu/cpu_util"][PATIENCE:], 75), abs=1e-3)


def test_batch_size_partial_window_and_several_nodes():
    """Pattern: algo-2's small batch only in its trailing 60 snapshots (partial window, final chunk)."""
    a = g.make_node("algo-1", n=N)
    b = g.make_node("algo-2", n=N + 60, seed=3)
    g.plant_small_batch(b, N, N + 60)
    out = g.run(BatchSize(patience=PATIENCE, window=WINDOW), g.chunk(a, b))
    assert out["Violations"] == 1 and out["Details"]["algo-2"]["windows"] == 11
    assert out["Datapoints"] == 2 * 10 * WINDOW + 60
    live = g.run(BatchSize(patience=PATIENCE, window=WINDOW), g.chunk(a, b, final=False))
    assert live["Violations"] == 0 and live["Datapoints"] == 2 * 10 * WINDOW


# -- GPUMemoryIncrease --------------------------------------------------------------------------------

MEM_WINDOW = 10


def _flat_memory(frame, level=40.0):
    for gpu in g.gpu_numbers(frame):
        frame.columns[g.col(f"gpu{gpu}", "gpu_mem_util")][:] = level
    return frame


def _mem(frame, final=True, **params):
    return g.run(GPUMemoryIncrease(**{"patience": PATIENCE, "window": MEM_WINDOW, **params}),
                 g.chunk(frame, final=final))


@pytest.mark.parametrize("rise, flagged", [(5.1, 1), (4.9, 0)])
def test_memory_increase_on_both_sides_of_threshold(rise, flagged):
    """Pattern: gpu1's memory steps up by `rise` points at a window boundary (window 30)."""
    frame = _flat_memory(g.make_node(n=N))
    at = PATIENCE + 30 * MEM_WINDOW
    g.plant_memory_step(frame, 1, at, rise)
    out = _mem(frame)
    assert out["Violations"] == out["RuleTriggered"] == flagged
    gpu1 = out["Details"]["algo-1"]["gpu1"]
    assert gpu1["increase"] == pytest.approx(rise)
    assert gpu1["gpu_max"] == pytest.approx(40 + rise) and gpu1["p05"] == 40.0
    assert gpu1["last_timestamp"] == (int(frame.timestamps[at + MEM_WINDOW - 1]) if flagged else None)
    assert out["Datapoints"] == N - PATIENCE
    if flagged:
        assert "memory of gpu1 on node algo-1 rose by more than 5 percentage points" in out["Recommendation"]


def test_memory_increase_compares_window_means():
    """Pattern: a step of 8 points in the middle of a window: its mean rises 4, the next window's 4 more:
    no single window rose by more than 5."""
    frame = _flat_memory(g.make_node(n=N))
    g.plant_memory_step(frame, 0, PATIENCE + 30 * MEM_WINDOW + MEM_WINDOW // 2, 8.0)
    out = _mem(frame)
    assert out["Violations"] == 0
    assert out["Details"]["algo-1"]["gpu0"]["increase"] == pytest.approx(4.0)


def test_memory_increase_counts_windows_and_gpus():
    """Pattern: both GPUs step up 10 at window 20 (one evaluation, two violations), gpu0 again at 50."""
    frame = _flat_memory(g.make_node(n=N))
    g.plant_memory_step(frame, 0, PATIENCE + 20 * MEM_WINDOW, 10.0)
    g.plant_memory_step(frame, 1, PATIENCE + 20 * MEM_WINDOW, 10.0)
    g.plant_memory_step(frame, 0, PATIENCE + 50 * MEM_WINDOW, 10.0)
    out = _mem(frame)
    assert out["RuleTriggered"] == 2 and out["Violations"] == 3
    assert out["Details"]["last_timestamp"] == int(frame.timestamps[PATIENCE + 51 * MEM_WINDOW - 1])
    assert "close to the maximum" not in out["Recommendation"]


def test_memory_increase_ignores_the_partial_last_window():
    """Pattern: a jump of 30 points in the last 5 snapshots, which do not fill a window."""
    frame = _flat_memory(g.make_node(n=N + 5))
    g.plant_memory_step(frame, 0, N, 30.0)
    out = _mem(frame)
    assert out["Violations"] == 0 and out["Datapoints"] == N - PATIENCE


def test_memory_increase_near_full_memory_says_so():
    frame = _flat_memory(g.make_node(n=N), 85.0)
    g.plant_memory_step(frame, 0, PATIENCE + 40 * MEM_WINDOW, 10.0)
    assert "close to the maximum" in _mem(frame)["Recommendation"]


# -- LoadBalancing ------------------------------------------------------------------------------------


def _reference_js(p, q):
    """Jensen–Shannon distance from its definition (natural log), as SageMaker computed it."""
    p, q = np.asarray(p, float) / np.sum(p), np.asarray(q, float) / np.sum(q)
    m = (p + q) / 2
    kl = lambda a: sum(x * math.log(x / y) for x, y in zip(a, m) if x > 0)  # noqa: E731
    return math.sqrt((kl(p) + kl(q)) / 2)


def _balance(frame, **params):
    return g.run(LoadBalancing(**{"patience": PATIENCE, **params}), g.chunk(frame))


def test_load_balancing_fires_on_both_sides_of_threshold():
    """Pattern: gpu0 flat at 81 %, gpu1 at 81 % but at 41 % for 30 % of the time; the rule run with a
    threshold just below and just above their distance."""
    frame = g.make_node(n=N)
    g.plant_gpu_util(frame, 0, 0, N, 81.0)
    g.plant_gpu_util(frame, 1, 0, N, 81.0)
    g.plant_gpu_util(frame, 1, PATIENCE, PATIENCE + 300, 41.0)
    hist0 = np.zeros(50)
    hist0[40] = 1000
    hist1 = hist0.copy()
    hist1[40], hist1[20] = 700, 300
    d = _reference_js(hist0, hist1)
    below = _balance(frame, threshold=round(d - 0.01, 3))
    above = _balance(frame, threshold=round(d + 0.01, 3))
    assert below["RuleTriggered"] == below["Violations"] == 1
    assert above["RuleTriggered"] == above["Violations"] == 0
    node = below["Details"]["algo-1"]
    assert node["distances"]["gpu0"]["gpu1"] == pytest.approx(d, abs=1e-4)
    assert node["workloads"]["gpu1"] == hist1.astype(int).tolist()
    assert node["imbalanced"] == [["gpu0", "gpu1", round(d, 4)]]
    assert node["mean_utilization"] == {"gpu0": 81.0, "gpu1": 69.0}
    assert "gpu0 and gpu1 had different workloads" in below["Recommendation"]


def test_load_balancing_counts_full_utilization_in_the_last_bin():
    """Pattern: gpu0 at 100 % throughout (SageMaker dropped values above 98 %), gpu1 at 80 %."""
    frame = g.make_node(n=N)
    g.plant_gpu_util(frame, 0, 0, N, 100.0)
    out = _balance(frame)
    node = out["Details"]["algo-1"]
    assert node["workloads"]["gpu0"][-1] == N - PATIENCE and sum(node["workloads"]["gpu0"]) == N - PATIENCE
    assert node["binedges"][0] == 0.0 and node["binedges"][-1] == 100.0 and len(node["binedges"]) == 51
    assert out["Violations"] == 1
    assert node["distances"]["gpu0"]["gpu1"] == pytest.approx(math.sqrt(math.log(2)), abs=1e-4)  # the maximum


def test_load_balancing_every_pair_and_several_nodes():
    """Pattern: on algo-1 (4 GPUs) gpu3 idles at 5 % -> 3 pairs apart; algo-2 balanced; cpu-1 skipped."""
    a = g.make_node("algo-1", n=N, gpus=4)
    g.plant_gpu_util(a, 3, 0, N, 5.0)
    b = g.make_node("algo-2", n=N, gpus=2, seed=1)
    out = g.run(LoadBalancing(patience=PATIENCE), g.chunk(a, b, g.make_node("cpu-1", n=N, gpus=0)))
    assert out["Violations"] == out["RuleTriggered"] == 3
    d = out["Details"]["algo-1"]["distances"]
    assert {k: sorted(v) for k, v in d.items()} == {"gpu0": ["gpu1", "gpu2", "gpu3"], "gpu1": ["gpu2", "gpu3"],
                                                    "gpu2": ["gpu3"]}
    assert [p[:2] for p in out["Details"]["algo-1"]["imbalanced"]] == [["gpu0", "gpu3"], ["gpu1", "gpu3"],
                                                                        ["gpu2", "gpu3"]]
    assert out["Details"]["algo-2"]["imbalanced"] == []
    assert out["Datapoints"] == 2 * (N - PATIENCE)
    assert "cpu-1" in out["Details"]["not_applicable"]


def test_load_balancing_patience_and_single_gpu():
    """Pattern: gpu1 idle only during patience (ignored); a one-GPU node has nothing to balance."""
    frame = g.make_node(n=N)
    g.plant_gpu_util(frame, 1, 0, PATIENCE, 0.0)
    assert _balance(frame)["Violations"] == 0
    single = _balance(g.make_node(n=N, gpus=1))
    assert single["Status"] == "ok" and single["Violations"] == 0 and "one GPU only" in single["Message"]


def test_load_balancing_tells_one_gpu_from_a_run_too_short_to_judge():
    """Within patience no histogram is filled: a 2-GPU node then read "one GPU only" (and a 1-GPU node's verdict
    "too short"). The GPUs are counted during patience too."""
    short_pair = _balance(g.make_node(n=PATIENCE // 2, gpus=2))
    assert short_pair["Datapoints"] == 0 and "one GPU only" not in short_pair["Message"]
    assert short_pair["Details"]["algo-1"]["gpus"] == 2 and "nothing_to_compare" not in short_pair["Details"]
    short_single = _balance(g.make_node(n=PATIENCE // 2, gpus=1))
    assert "one GPU only" in short_single["Message"] and short_single["Details"]["nothing_to_compare"] is True


def test_js_distance_matches_scipy():
    scipy_distance = pytest.importorskip("scipy.spatial.distance")
    rng = np.random.default_rng(0)
    for _ in range(5):
        p, q = rng.integers(0, 50, 50).astype(float), rng.integers(0, 50, 50).astype(float)
        assert js_distance(p, q) == pytest.approx(scipy_distance.jensenshannon(p, q), abs=1e-9)
