"""One node's system metrics over a time range, as the dashboard's Nodes view draws them: the node's CPU, each
core, I/O wait, memory, network and each GPU (utilization and memory), plus the GPUs' mean and their lowest and
highest, each reduced to min / max / mean per time bucket (peaks survive any zoom), or raw when the range holds
fewer snapshots than buckets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch import records as r
from stallwatch.analyze.downsample import minmax_matrix
from stallwatch.analyze.frames import NodeFrame
from stallwatch.analyze.loss import gap_limits_us
from stallwatch.records import COLUMN_SEP, TIMESTAMP

# What the Nodes view reads from the store (every device of each metric).
METRICS = (r.CPU_UTIL, r.CPU_IOWAIT, r.MEM_UTIL, r.NET_RX_BPS, r.NET_TX_BPS, r.GPU_UTIL, r.GPU_MEM_UTIL)
# Series of the live stream (one value per snapshot): what the Overview and the charts' live edge show.
LIVE_SERIES = ("cpu", "job", "gpu", "gpu_mem", "memory", "iowait", "net_rx", "net_tx")


@dataclass(frozen=True)
class Band:
    """Per bucket: the lowest, highest and mean value (NaN where the bucket is empty)."""
    min: np.ndarray
    max: np.ndarray
    mean: np.ndarray


@dataclass(frozen=True)
class NodeSeries:
    node: str
    start_us: int | None  # the range asked for (None: the node's first / last snapshot)
    end_us: int | None
    bucket_us: int  # width of a bucket; the sampling interval or less means full resolution
    ts: np.ndarray  # bucket starts (µs)
    series: dict[str, Band]  # cpu, job (the job's processes), cpuN, iowait, memory, net_rx / net_tx (MB/s), gpuN…
    cores: list[str]
    gpus: list[str]
    snapshots: int  # in the range
    full_resolution: bool


def named_columns(frame: NodeFrame) -> dict[str, np.ndarray]:
    """The node's series by the names the dashboard uses, one value per snapshot (float32, NaN where none)."""
    out: dict[str, np.ndarray] = {}
    for name, device, metric in (("cpu", r.CPU, r.CPU_UTIL), ("job", r.PROC, r.CPU_UTIL),
                                 ("iowait", r.CPU, r.CPU_IOWAIT), ("memory", r.MEMORY, r.MEM_UTIL)):
        v = frame.get(device, metric)
        if v is not None:
            out[name] = v
    for name, metric in (("net_rx", r.NET_RX_BPS), ("net_tx", r.NET_TX_BPS)):
        v = frame.get(r.NET, metric)
        if v is not None:
            out[name] = (v / np.float32(1e6)).astype(np.float32)
    for core in frame.devices("cpu", r.CPU_UTIL):
        out[core] = frame.get(core, r.CPU_UTIL)  # type: ignore[assignment]
    gpus = frame.devices("gpu", r.GPU_UTIL)
    for gpu in gpus:
        out[gpu] = frame.get(gpu, r.GPU_UTIL)  # type: ignore[assignment]
        mem = frame.get(gpu, r.GPU_MEM_UTIL)
        if mem is not None:
            out[f"{gpu}_mem"] = mem
    if gpus:
        util = frame.matrix(gpus, r.GPU_UTIL)
        mem = frame.matrix(gpus, r.GPU_MEM_UTIL)
        out["gpu"], out["gpu_lo"], out["gpu_hi"] = _across(util)
        out["gpu_mem"], _, _ = _across(mem)
    return out


def node_series(frame: NodeFrame, start_us: int | None = None, end_us: int | None = None,
                buckets: int = 600) -> NodeSeries:
    """The node's series in [start_us, end_us), min / max / mean per bucket (at most `buckets`)."""
    ts = frame.timestamps
    lo = 0 if start_us is None else int(np.searchsorted(ts, start_us, "left"))
    hi = len(ts) if end_us is None else int(np.searchsorted(ts, end_us, "left"))
    cols = named_columns(frame)
    names = list(cols)
    window = ts[lo:hi]
    cores = frame.devices("cpu", r.CPU_UTIL)
    gpus = frame.devices("gpu", r.GPU_UTIL)
    if not names or not len(window):
        empty = np.empty(0, np.float32)
        return NodeSeries(frame.node, start_us, end_us, 0, np.empty(0, np.int64),
                          {n: Band(empty, empty, empty) for n in names}, cores, gpus, 0, True)
    matrix = np.column_stack([cols[n][lo:hi] for n in names])
    interval_us = frame.sample_interval_ms * 1000
    if len(window) <= buckets:  # every snapshot fits: drawn as taken, never bucketed (jitter emptied buckets)
        return _snapshots(frame, window, matrix, names, start_us, end_us, cores, gpus, int(interval_us))
    b = minmax_matrix(window, matrix, max(1, buckets))
    series = {n: Band(b.min[:, i], b.max[:, i], b.mean[:, i]) for i, n in enumerate(names)}
    return NodeSeries(frame.node, start_us, end_us, b.width, b.start, series, cores, gpus, len(window),
                      interval_us > 0 and b.width <= interval_us * 1.5)


def _snapshots(frame: NodeFrame, ts: np.ndarray, matrix: np.ndarray, names: list[str], start_us: int | None,
               end_us: int | None, cores: list[str], gpus: list[str], interval_us: int) -> NodeSeries:
    """Full resolution: one point per snapshot, and an empty point (a break in the line) inside each stretch
    without snapshots long enough to be a gap (the loss rule's limit, with the node's interval changes)."""
    ts = np.asarray(ts, np.int64)
    data = np.asarray(matrix, np.float32)
    if len(ts) > 1:
        gaps = np.flatnonzero(np.diff(ts) > gap_limits_us(ts[:-1], ts[1:], frame.sample_interval_ms or None,
                                                          frame.interval_changes))
        if len(gaps):
            ts = np.insert(ts, gaps + 1, ts[gaps] + (ts[gaps + 1] - ts[gaps]) // 2)
            data = np.insert(data, gaps + 1, np.nan, axis=0)
    series = {n: Band(data[:, i], data[:, i], data[:, i]) for i, n in enumerate(names)}
    return NodeSeries(frame.node, start_us, end_us, interval_us, ts, series, cores, gpus, len(matrix), True)


def tidy_frame(node: str, tidy: pa.Table, info: dict[str, Any] | None = None) -> NodeFrame:
    """One node's tidy rows (`Run.system`, a live tail) as a NodeFrame: aligned `device/metric` columns."""
    mine = tidy.filter(pc.equal(tidy["node"].cast(pa.string()), node)) if "node" in tidy.column_names else tidy
    if mine.num_rows == 0:
        return NodeFrame(node, np.empty(0, np.int64), {}, dict(info or {}))
    stamps, row = np.unique(mine[TIMESTAMP].to_numpy(), return_inverse=True)
    names = pc.binary_join_element_wise(mine["device"].cast(pa.string()), mine["metric"].cast(pa.string()),
                                        COLUMN_SEP).to_numpy(zero_copy_only=False)
    values = mine["value"].to_numpy(zero_copy_only=False)
    cols = {}
    for name in np.unique(names):
        mask = names == name
        col = np.full(len(stamps), np.nan, np.float32)
        col[row[mask]] = values[mask]
        cols[str(name)] = col
    return NodeFrame(node, stamps.astype(np.int64), cols, dict(info or {}))


def _across(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per snapshot: the mean, lowest and highest over the devices (NaN where none has a value)."""
    valid = ~np.isnan(matrix)
    has = valid.any(axis=1)
    count = valid.sum(axis=1)
    total = np.where(valid, matrix, 0).sum(axis=1, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(has, total / np.maximum(count, 1), np.nan).astype(np.float32)
    lo = np.where(has, np.where(valid, matrix, np.inf).min(axis=1), np.nan).astype(np.float32)
    hi = np.where(has, np.where(valid, matrix, -np.inf).max(axis=1), np.nan).astype(np.float32)
    return mean, lo, hi


def without_quiet_buckets(ns: NodeSeries, changes: list[tuple[int, float]]) -> NodeSeries:
    """After a live change to a longer interval, buckets narrower than it are mostly empty: drop the empty
    ones that fall between two snapshots closer than the loss rule's gap, so a line joins them; an empty
    bucket inside a real gap stays (the chart breaks there)."""
    if not changes or len(ns.ts) < 3 or not ns.series:
        return ns
    filled = np.zeros(len(ns.ts), bool)
    for band in ns.series.values():
        filled |= ~np.isnan(np.asarray(band.mean, dtype=np.float64))
    at = np.flatnonzero(filled)
    if len(at) < 2:
        return ns
    keep = filled.copy()
    prev = np.maximum.accumulate(np.where(filled, np.arange(len(filled)), -1))  # the last filled bucket so far
    nxt = np.searchsorted(at, np.arange(len(filled)))  # index in `at` of the next filled bucket
    for i in np.flatnonzero(~filled):
        p, j = prev[i], nxt[i]
        if p < 0 or j >= len(at):
            continue
        a, b = ns.ts[p], ns.ts[at[j]]
        if b - a > gap_limits_us(np.array([a]), np.array([b]), None, changes)[0]:
            keep[i] = True
    series = {k: Band(b.min[keep], b.max[keep], b.mean[keep]) for k, b in ns.series.items()}
    return dataclasses.replace(ns, ts=ns.ts[keep], series=series)
