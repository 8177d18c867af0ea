"""Generated system data for rule tests: a healthy node (busy GPUs, moderate CPU) as a NodeFrame, and
functions that plant one named pattern into it over snapshots [a, b) (half-open, snapshot indices).

The healthy baseline is chosen far from every rule's default thresholds, so that only what a test
plants can make a rule fire:
- GPU utilization 80 ± 5 %, GPU memory 40 ± 0.5 % (flat), per core CPU 30 ± 5 %, I/O wait 1 ± 0.5 %,
  total CPU 30 ± 5 %, CPU memory 25 %, network and disk about 1 MB/s.
Values are rounded as the sampler's sources give them (GPU utilization whole percent)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from stallwatch.analyze.rules.base import Chunk, NodeFrame, Rule
from stallwatch.analyze.judge.feed import split_by_time
from stallwatch.records import framework_schema
from stallwatch.store.run_files import jsonable as _plain

START_US = 1_700_000_000_000_000
INTERVAL_US = 500_000  # the sampler's default: 500 ms


def col(device: str, metric: str) -> str:
    return f"{device}/{metric}"


def make_node(name: str = "algo-1", n: int = 3000, cores: int = 4, gpus: int = 2, *, seed: int = 0,
              start_us: int = START_US, interval_us: int = INTERVAL_US, gpu_util: float = 80.0,
              gpu_mem: float = 40.0, cpu_util: float = 30.0, iowait: float = 1.0, mem_util: float = 25.0,
              dtype: Any = np.float64) -> NodeFrame:
    """A healthy node: `n` snapshots every `interval_us`, `cores` cores, `gpus` GPUs (0: CPU-only)."""
    rng = np.random.default_rng(seed)
    ts = start_us + interval_us * np.arange(n, dtype=np.int64)
    cols: dict[str, np.ndarray] = {}

    def noisy(center: float, spread: float, lo: float = 0.0, hi: float = 100.0) -> np.ndarray:
        return np.clip(center + rng.uniform(-spread, spread, n), lo, hi).astype(dtype)

    cols[col("cpu", "cpu_util")] = noisy(cpu_util, 5)
    cols[col("cpu", "cpu_iowait")] = noisy(iowait, 0.5)
    for c in range(cores):
        cols[col(f"cpu{c}", "cpu_util")] = noisy(cpu_util, 5)
        cols[col(f"cpu{c}", "cpu_iowait")] = noisy(iowait, 0.5)
    cols[col("memory", "mem_util")] = noisy(mem_util, 0.5)
    cols[col("memory", "mem_used_bytes")] = np.full(n, 16e9, dtype)
    cols[col("disk", "disk_read_bps")] = noisy(1e6, 2e5, 0, 1e12)
    cols[col("disk", "disk_write_bps")] = noisy(5e5, 1e5, 0, 1e12)
    cols[col("net", "net_rx_bps")] = noisy(1e6, 2e5, 0, 1e12)
    cols[col("net", "net_tx_bps")] = noisy(1e6, 2e5, 0, 1e12)
    for g in range(gpus):
        cols[col(f"gpu{g}", "gpu_util")] = np.round(noisy(gpu_util, 5)).astype(dtype)
        cols[col(f"gpu{g}", "gpu_mem_util")] = noisy(gpu_mem, 0.5)
        cols[col(f"gpu{g}", "gpu_mem_used_bytes")] = (cols[col(f"gpu{g}", "gpu_mem_util")] * 8e8).astype(dtype)
    info = {"node": name, "cpu_cores_logical": cores,
            "gpus": [{"index": g, "name": "Generated GPU", "memory_total_bytes": 80_000_000_000} for g in range(gpus)]}
    return NodeFrame(name, ts, cols, info)


def node_day(cores: int = 16, gpus: int = 8, n: int = 864_000, interval_us: int = 100_000) -> NodeFrame:
    """One node-day at 100 ms (the performance target's size)."""
    return make_node("algo-1", n, cores, gpus, interval_us=interval_us)


# -- planting ----------------------------------------------------------------------------------------


def set_values(frame: NodeFrame, column: str, a: int, b: int, values: Any) -> NodeFrame:
    """Snapshots [a, b) of `column` := values (a scalar or an array of b - a values)."""
    frame.columns[column][a:b] = values
    return frame


def plant_cpu_bottleneck(frame: NodeFrame, a: int, b: int, *, gpu: int = 0, core: int = 0,
                         gpu_util: float = 5.0, cpu_util: float = 95.0) -> NodeFrame:
    """CPU bottleneck over [a, b): `gpu` below 10 % while `core` is above 90 %."""
    set_values(frame, col(f"gpu{gpu}", "gpu_util"), a, b, gpu_util)
    return set_values(frame, col(f"cpu{core}", "cpu_util"), a, b, cpu_util)


def plant_io_bottleneck(frame: NodeFrame, a: int, b: int, *, gpu: int = 0, core: int = 0,
                        gpu_util: float = 5.0, iowait: float = 60.0) -> NodeFrame:
    """I/O bottleneck over [a, b): `gpu` below 10 % while `core` waits on I/O above 50 %."""
    set_values(frame, col(f"gpu{gpu}", "gpu_util"), a, b, gpu_util)
    return set_values(frame, col(f"cpu{core}", "cpu_iowait"), a, b, iowait)


def plant_gpu_util(frame: NodeFrame, gpu: int, a: int, b: int, values: Any) -> NodeFrame:
    return set_values(frame, col(f"gpu{gpu}", "gpu_util"), a, b, values)


def plant_fluctuation(frame: NodeFrame, gpu: int, a: int, b: int, *, high: float = 95.0, low: float = 2.0,
                      every: int = 4) -> NodeFrame:
    """Fluctuating GPU over [a, b): `high`, dropping to `low` every `every`-th snapshot (p95 high, p5 low)."""
    v = np.full(b - a, high)
    v[::every] = low
    return plant_gpu_util(frame, gpu, a, b, v)


def plant_memory_step(frame: NodeFrame, gpu: int, at: int, rise: float) -> NodeFrame:
    """GPU memory utilization of `gpu` jumps by `rise` points at snapshot `at` and stays there."""
    frame.columns[col(f"gpu{gpu}", "gpu_mem_util")][at:] += rise
    return frame


def plant_small_batch(frame: NodeFrame, a: int, b: int, *, cpu: float = 20.0, gpu: float = 30.0,
                      gpu_mem: float = 20.0, gpus: list[int] | None = None) -> NodeFrame:
    """Small batch over [a, b): total CPU, GPU utilization and GPU memory all low (on `gpus`, default all)."""
    set_values(frame, col("cpu", "cpu_util"), a, b, cpu)
    for g in gpus if gpus is not None else gpu_numbers(frame):
        set_values(frame, col(f"gpu{g}", "gpu_util"), a, b, gpu)
        set_values(frame, col(f"gpu{g}", "gpu_mem_util"), a, b, gpu_mem)
    return frame


def gpu_numbers(frame: NodeFrame) -> list[int]:
    return [int(d[3:]) for d in frame.devices("gpu", "gpu_util")]


# -- feeding -----------------------------------------------------------------------------------------


def chunk(*frames: NodeFrame, final: bool = True) -> Chunk:
    return Chunk({f.node: f for f in frames}, framework_schema().empty_table(), {}, final=final)


def random_boundaries(c: Chunk, pieces: int, seed: int) -> list[int]:
    """`pieces - 1` cut times drawn at random over the chunk's time span (repeats allowed: empty chunks)."""
    ts = np.concatenate([f.timestamps for f in c.system.values() if len(f)])
    rng = np.random.default_rng(seed)
    return sorted(int(x) for x in rng.integers(int(ts.min()), int(ts.max()) + 2, pieces - 1))


def split(c: Chunk, pieces: int, seed: int) -> list[Chunk]:
    return split_by_time(c, random_boundaries(c, pieces, seed))


def run(rule: Rule, chunks: list[Chunk] | Chunk) -> dict[str, Any]:
    """Feed the chunks in order; the result as JSON-ready dict."""
    for c in [chunks] if isinstance(chunks, Chunk) else chunks:
        rule.update(c)
    return rule.result().to_json()


def as_text(result: dict[str, Any]) -> str:
    """The result exactly as the runner would write it (NaN-safe comparison)."""
    return json.dumps(result, default=_plain)


def assert_chunk_invariant(rule_cls: type[Rule], c: Chunk, params: dict[str, Any] | None = None,
                           splits: tuple[tuple[int, int], ...] = ((2, 1), (9, 2), (40, 3))) -> dict[str, Any]:
    """The same data in one chunk and cut into many at random times give identical results."""
    params = params or {}
    whole = as_text(run(rule_cls(**params), c))
    for pieces, seed in splits:
        parts = as_text(run(rule_cls(**params), split(c, pieces, seed)))
        assert parts == whole, f"{rule_cls.name}: {pieces} chunks (seed {seed}) differ from one chunk"
    return json.loads(whole)
