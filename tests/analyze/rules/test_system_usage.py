"""OverallSystemUsage on generated nodes: statistics against numpy, derived metrics (mean of GPUs,
received + sent), CPU-only nodes, the verdicts from both sides of 70 %, one chunk vs many."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze.rules.system_usage import OverallSystemUsage
from tests.analyze.rules import _gen as g

N = 1200


def _usage(*frames, final=True):
    return g.run(OverallSystemUsage(), g.chunk(*frames, final=final))


def _expected(values: np.ndarray) -> dict[str, float]:
    v = np.asarray(values, np.float64)
    p99, p95, p50 = np.percentile(v, [99, 95, 50])
    return {"max": v.max(), "p99": p99, "p95": p95, "p50": p50, "min": v.min()}


def _close(got: dict[str, float], want: dict[str, float], tol: float = 1e-3) -> None:
    assert list(got) == ["max", "p99", "p95", "p50", "min"]
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=tol, rel=1e-6), k


def test_statistics_per_node_and_metric_over_all_snapshots():
    """Pattern: a ramp of total CPU 0..100 % over the whole run (no patience: every snapshot counts)."""
    frame = g.make_node(n=N)
    g.set_values(frame, "cpu/cpu_util", 0, N, np.linspace(0, 100, N))
    out = _usage(frame)
    assert out["Status"] == "ok"
    assert out["RuleTriggered"] == out["Violations"] == 0 and out["Datapoints"] == N
    d = out["Details"]
    assert list(d) == ["CPU", "CPU memory", "GPU", "GPU memory", "I/O", "Network", "devices"]
    _close(d["CPU"]["algo-1"], _expected(np.linspace(0, 100, N)))
    _close(d["CPU memory"]["algo-1"], _expected(frame.columns["memory/mem_util"]))
    _close(d["I/O"]["algo-1"], _expected(frame.columns["cpu/cpu_iowait"]))


def test_gpu_is_the_mean_of_the_nodes_gpus_and_network_is_rx_plus_tx():
    """Pattern: gpu0 at 100 %, gpu1 at 0 % except gpu1 missing (NaN) for 100 snapshots; rx 1 MB/s, tx 3 MB/s."""
    frame = g.make_node(n=N)
    g.plant_gpu_util(frame, 0, 0, N, 100.0)
    g.plant_gpu_util(frame, 1, 0, N, 0.0)
    g.plant_gpu_util(frame, 1, 0, 100, np.nan)
    g.set_values(frame, "net/net_rx_bps", 0, N, 1e6)
    g.set_values(frame, "net/net_tx_bps", 0, N, 3e6)
    d = _usage(frame)["Details"]
    gpu_mean = np.where(np.arange(N) < 100, 100.0, 50.0)
    _close(d["GPU"]["algo-1"], _expected(gpu_mean))
    assert d["Network"]["algo-1"] == {"max": 4e6, "p99": 4e6, "p95": 4e6, "p50": 4e6, "min": 4e6}
    mems = np.mean([frame.columns["gpu0/gpu_mem_util"], frame.columns["gpu1/gpu_mem_util"]], axis=0)
    _close(d["GPU memory"]["algo-1"], _expected(np.round(mems, 2)))  # the mean at the stored resolution


def test_per_device_statistics():
    frame = g.make_node(n=N, cores=3, gpus=2)
    devices = _usage(frame)["Details"]["devices"]["algo-1"]
    assert list(devices) == ["cpu0", "cpu1", "cpu2", "gpu0", "gpu1", "disk", "net"]
    _close(devices["cpu2"]["cpu_util"], _expected(frame.columns["cpu2/cpu_util"]))
    _close(devices["gpu1"]["gpu_mem_util"], _expected(frame.columns["gpu1/gpu_mem_util"]))
    assert sorted(devices["gpu0"]) == ["gpu_mem_util", "gpu_util"]
    _close(devices["net"]["net_tx_bps"], _expected(frame.columns["net/net_tx_bps"]), tol=0.1)
    assert sorted(devices["disk"]) == ["disk_read_bps", "disk_write_bps"]


def test_cpu_only_nodes_have_no_gpu_rows():
    """Pattern: one GPU node and one CPU-only node; then a CPU-only run."""
    mixed = _usage(g.make_node("algo-1", n=N), g.make_node("cpu-1", n=N // 2, gpus=0, seed=1))["Details"]
    assert sorted(mixed["CPU"]) == ["algo-1", "cpu-1"]
    assert list(mixed["GPU"]) == ["algo-1"] and list(mixed["GPU memory"]) == ["algo-1"]
    cpu_only = _usage(g.make_node("cpu-1", n=N, gpus=0))
    assert cpu_only["Status"] == "ok" and "GPU" not in cpu_only["Details"] and cpu_only["Datapoints"] == N


@pytest.mark.parametrize("gpu, cpu, verdict", [
    (69.0, 69.0, "node algo-1 is underutilized"),
    (71.0, 69.0, "are well utilized"),
    (69.0, 71.0, "likely because of CPU bottlenecks"),
])
def test_verdicts_from_both_sides_of_70_percent(gpu, cpu, verdict):
    """Pattern: GPUs and total CPU flat at 69 % / 71 % (the report's 70 % cut on p95 and median)."""
    frame = g.make_node(n=N)
    g.plant_gpu_util(frame, 0, 0, N, gpu)
    g.plant_gpu_util(frame, 1, 0, N, gpu)
    g.set_values(frame, "cpu/cpu_util", 0, N, cpu)
    assert verdict in _usage(frame)["Recommendation"]


def test_no_data_is_not_applicable():
    out = g.run(OverallSystemUsage(), g.chunk())
    assert out["Status"] == "not_applicable" and out["Datapoints"] == 0


def test_one_chunk_and_many_chunks_agree():
    """Pattern: two nodes with different starts and device counts, gaps (NaN) in a GPU and the network."""
    a = g.make_node("algo-1", n=N, cores=2, gpus=3)
    b = g.make_node("algo-2", n=N + 77, cores=5, gpus=0, start_us=g.START_US + 3 * g.INTERVAL_US + 17, seed=2)
    g.plant_gpu_util(a, 2, 300, 420, np.nan)
    g.set_values(a, "net/net_rx_bps", 10, 50, np.nan)
    out = g.assert_chunk_invariant(OverallSystemUsage, g.chunk(a, b))
    assert out["Datapoints"] == 2 * N + 77
