"""Per-node utilization statistics of the system metrics: what the run summary and `stallwatch info` show."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch import records as r

# (label, device selector, metric, unit): a selector is a device name or a prefix ending in '*'.
USAGE_ROWS = (
    ("CPU total", r.CPU, r.CPU_UTIL, "%"),
    ("CPU busiest core", "cpu*", r.CPU_UTIL, "%"),
    ("I/O wait", r.CPU, r.CPU_IOWAIT, "%"),
    ("Memory", r.MEMORY, r.MEM_UTIL, "%"),
    ("GPU", "gpu*", r.GPU_UTIL, "%"),
    ("GPU memory", "gpu*", r.GPU_MEM_UTIL, "%"),
    ("Disk read", r.DISK, r.DISK_READ_BPS, "B/s"),
    ("Disk write", r.DISK, r.DISK_WRITE_BPS, "B/s"),
    ("Network rx", r.NET, r.NET_RX_BPS, "B/s"),
    ("Network tx", r.NET, r.NET_TX_BPS, "B/s"),
    ("Job CPU", r.PROC, r.PROC_CPU_UTIL, "%"),
    ("Job memory (RSS)", r.PROC, r.PROC_RSS_BYTES, "B"),
    ("Loader workers alive", r.PROC, r.WORKERS_ALIVE, ""),
)


@dataclass(frozen=True)
class UsageStat:
    node: str
    label: str
    unit: str
    mean: float
    p50: float
    p95: float
    max: float
    count: int


@dataclass(frozen=True)
class NodeSpan:
    node: str
    snapshots: int
    start_us: int
    end_us: int


def node_spans(table: pa.Table) -> list[NodeSpan]:
    """Snapshots per node (distinct timestamps) and the time they cover."""
    out = []
    for node in _nodes(table):
        ts = np.unique(table.filter(pc.equal(table["node"], node))["timestamp_us"].to_numpy())
        if len(ts):
            out.append(NodeSpan(node, int(len(ts)), int(ts[0]), int(ts[-1])))
    return out


def usage_stats(table: pa.Table) -> list[UsageStat]:
    """Mean, median, p95 and max per node for each row of USAGE_ROWS present in `table`."""
    out: list[UsageStat] = []
    for node in _nodes(table):
        t = table.filter(pc.equal(table["node"], node))
        devices = t["device"].cast(pa.string())
        metrics = t["metric"].cast(pa.string())
        values = t["value"].to_numpy(zero_copy_only=False)
        for label, selector, metric, unit in USAGE_ROWS:
            if selector.endswith("*"):
                prefix = selector[:-1]
                dev_mask = pc.and_(pc.starts_with(devices, prefix),
                                   pc.greater(pc.utf8_length(devices), len(prefix)))
            else:
                dev_mask = pc.equal(devices, selector)
            mask = pc.and_(dev_mask, pc.equal(metrics, metric)).to_numpy(zero_copy_only=False)
            v = values[mask]
            v = v[~np.isnan(v)]
            if label == "CPU busiest core" and len(v):
                v = _busiest_per_snapshot(t, mask)
                v = v[~np.isnan(v)]  # a snapshot where no core had a value
            if not len(v):
                continue
            p50, p95 = np.percentile(v, [50, 95])
            out.append(UsageStat(node, label, unit, float(v.mean()), float(p50), float(p95), float(v.max()), len(v)))
    return out


def _busiest_per_snapshot(t: pa.Table, mask: np.ndarray) -> np.ndarray:
    ts = t["timestamp_us"].to_numpy()[mask]
    v = t["value"].to_numpy(zero_copy_only=False)[mask]
    order = np.argsort(ts, kind="stable")
    ts, v = ts[order], v[order]
    starts = np.flatnonzero(np.r_[True, ts[1:] != ts[:-1]])
    return np.fmax.reduceat(v, starts)


def _nodes(table: pa.Table) -> list[str]:
    if table.num_rows == 0:
        return []
    return sorted(pc.unique(table["node"].cast(pa.string())).to_pylist())
