"""Storage: bytes per stored metric value in stallwatch's run directory, side by side with the same
samples written as JSON lines in SageMaker Debugger's system-metrics format.

Target (issue 2): <= 2 bytes per stored value (SageMaker's format: about 110 bytes per value).
Run: python benchmarks/storage_size.py [--minutes 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, table  # noqa: E402

from stallwatch import records as r  # noqa: E402
from stallwatch.collect.system import SystemSampler  # noqa: E402
from stallwatch.records import MetricKey  # noqa: E402
from stallwatch.store.location import RunLocation  # noqa: E402
from stallwatch.store.system_writer import SystemWriter  # noqa: E402

T0 = 1_763_790_000_000_000
# SageMaker's (Type, Dimension) for each of our metrics.
_SM = {r.CPU_UTIL: ("cpu", "CPUUtilization"), r.CPU_IOWAIT: ("cpu", "IOWait"), r.MEM_UTIL: ("memory", "MemoryUsedPercent"),
       r.MEM_USED_BYTES: ("memory", "MemoryUsed"), r.DISK_READ_BPS: ("io", "ReadBytesPerSecond"),
       r.DISK_WRITE_BPS: ("io", "WriteBytesPerSecond"), r.NET_RX_BPS: ("network", "ReceiveBytesPerSecond"),
       r.NET_TX_BPS: ("network", "TransmitBytesPerSecond"), r.GPU_UTIL: ("gpu", "GPUUtilization"),
       r.GPU_MEM_UTIL: ("gpu", "GPUMemoryUtilization")}


def generated_node(minutes: float, interval_ms: int, cores: int = 16, gpus: int = 8, seed: int = 0):
    """A busy training node: per-core CPU and GPU utilization as noisy random walks with step-time
    periodicity, data-loader I/O bursts, slowly growing memory — the shape real traces have."""
    rng = np.random.default_rng(seed)
    n = int(minutes * 60_000 / interval_ms)
    ts = T0 + np.arange(n, dtype=np.int64) * interval_ms * 1000 + rng.integers(0, 400, n)
    keys: list[MetricKey] = [MetricKey("cpu", r.CPU_UTIL), MetricKey("cpu", r.CPU_IOWAIT)]
    cols: list[np.ndarray] = []
    core_util = np.clip(50 + np.cumsum(rng.normal(0, 2, (n, cores)), axis=0) * 0.1 + rng.normal(0, 8, (n, cores)), 0, 100)
    core_io = np.clip(rng.exponential(1.0, (n, cores)) - 0.8, 0, 100)
    cols += [core_util.mean(axis=1), core_io.mean(axis=1)]
    for i in range(cores):
        keys += [MetricKey(f"cpu{i}", r.CPU_UTIL), MetricKey(f"cpu{i}", r.CPU_IOWAIT)]
        cols += [core_util[:, i], core_io[:, i]]
    mem = 40 + np.cumsum(rng.normal(0.001, 0.01, n))
    keys += [MetricKey("memory", r.MEM_UTIL), MetricKey("memory", r.MEM_USED_BYTES)]
    cols += [mem, mem / 100 * 1.1e12]
    burst = rng.random(n) < 0.2
    keys += [MetricKey("disk", r.DISK_READ_BPS), MetricKey("disk", r.DISK_WRITE_BPS),
             MetricKey("net", r.NET_RX_BPS), MetricKey("net", r.NET_TX_BPS)]
    cols += [np.where(burst, rng.uniform(1e8, 2e9, n), rng.uniform(0, 1e5, n)),
             np.where(rng.random(n) < 0.02, rng.uniform(1e6, 5e8, n), 0.0),
             rng.uniform(5e7, 2e8, n), rng.uniform(5e7, 2e8, n)]
    phase = np.sin(np.arange(n) / 7.0)
    for g in range(gpus):
        util = np.clip(np.round(85 + 10 * phase + rng.normal(0, 6, n)), 0, 100)
        used = 6.0e10 + np.cumsum(rng.integers(0, 2, n)) * 2**21
        for metric, col in ((r.GPU_UTIL, util), (r.GPU_MEM_UTIL, 100 * used / 8.5e10), (r.GPU_MEM_USED_BYTES, used),
                            (r.GPU_MEM_BW_UTIL, np.clip(np.round(util * 0.6 + rng.normal(0, 3, n)), 0, 100)),
                            (r.GPU_POWER_W, np.round(250 + 100 * phase + rng.normal(0, 15, n), 3)),
                            (r.GPU_TEMP_C, np.round(65 + 3 * phase + rng.normal(0, 0.5, n))),
                            (r.GPU_SM_CLOCK_MHZ, np.where(rng.random(n) < 0.95, 1980.0, 1755.0))):
            keys.append(MetricKey(f"gpu{g}", metric))
            cols.append(col)
    workers = np.where(rng.random(n) < 0.9, 8.0, 7.0)
    for metric, col in ((r.PROC_CPU_UTIL, core_util.mean(axis=1) * 0.8), (r.PROC_RSS_BYTES, 3.2e10 + mem * 1e7),
                        (r.PROC_COUNT, workers + 1), (r.WORKERS_ALIVE, workers), (r.WORKERS_BUSY, np.minimum(workers, np.round(workers * rng.random(n) + 0.5))),
                        (r.WORKERS_CPU_UTIL, core_util.mean(axis=1) * 0.4)):
        keys.append(MetricKey("proc", metric))
        cols.append(col)
    return keys, ts, np.column_stack(cols)


def real_node(snapshots: int, spacing_s: float):
    """Snapshots from this machine's real sampler (fast spacing so the benchmark stays short)."""
    s = SystemSampler()
    rows, ts = [], []
    for _ in range(snapshots):
        time.sleep(spacing_s)
        t, v = s.snapshot()
        ts.append(t)
        rows.append(v)
    s.close()
    return s.keys, np.array(ts, dtype=np.int64), np.array(rows, dtype=np.float64)


def stallwatch_bytes(keys, ts, values, interval_ms: int, workdir: Path) -> tuple[int, int]:
    loc = RunLocation(str(workdir))
    w = SystemWriter(loc, "n", keys, interval_us=interval_ms * 1000, flush_interval_us=5_000_000, max_bytes=1 << 40)
    for t, row in zip(ts, values):
        w.append(int(t), row)
        w.tick(int(t))
    w.close()
    files = loc.list("system")
    return sum(f.size for f in files), len(files)


def sagemaker_bytes(keys, ts, values) -> int:
    """The same samples as SageMaker Debugger's system-metrics JSON lines (one line per value)."""
    total = 0
    for t, row in zip(ts, values):
        for k, v in zip(keys, row):
            if v != v:
                continue
            typ, dim = _SM.get(k.metric, (k.device.rstrip("0123456789"), k.metric))
            total += len(json.dumps({"Type": typ, "Name": k.device, "Dimension": dim, "Value": float(v),
                                     "Timestamp": t / 1e6})) + 1
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="length of the generated node's run")
    args = p.parse_args()
    cases = [(f"generated 16 cores + 8 GPUs, {args.minutes:g} min @ 500 ms", generated_node(args.minutes, 500), 500),
             (f"generated 16 cores + 8 GPUs, {args.minutes / 5:g} min @ 100 ms", generated_node(args.minutes / 5, 100), 100),
             ("real samples of this machine (600 snapshots)", real_node(600, 0.05), 500)]
    rows = []
    for name, (keys, ts, values), interval in cases:
        n_values = int((~np.isnan(values)).sum())
        with tempfile.TemporaryDirectory() as tmp:
            ours, nfiles = stallwatch_bytes(keys, ts, values, interval, Path(tmp))
        theirs = sagemaker_bytes(keys, ts, values)
        rows.append([name, f"{n_values:,}", f"{ours / n_values:.2f}", f"{theirs / n_values:.1f}",
                     f"{theirs / ours:.0f}x", str(nfiles)])
    print(f"Bytes per stored metric value ({machine()})")
    print(table(["samples", "values", "stallwatch B/value", "SageMaker JSON B/value", "ratio", "files"], rows))


if __name__ == "__main__":
    main()
