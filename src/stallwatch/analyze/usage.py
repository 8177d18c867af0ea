"""Per-node utilization statistics of the system metrics: what the run summary and `stallwatch info` show."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch import catalogue
from stallwatch import records as r
from stallwatch.records import COLUMN_SEP, TIMESTAMP, MetricKey


def _row(device: str, metric: str, selector: str | None = None) -> tuple[str, str, str, str]:
    """(label, device selector, metric, unit) of a catalogue metric; a selector is a device name or a prefix
    ending in '*'."""
    entry = catalogue.metric(device, metric)
    assert entry is not None, (device, metric)
    return entry.label, selector or device, metric, "" if entry.unit == "count" else entry.unit


USAGE_ROWS = (
    _row(r.CPU, r.CPU_UTIL),
    ("CPU busiest core", "cpu*", r.CPU_UTIL, "%"),  # a statistic of the cores, not a stored metric
    _row(r.CPU, r.CPU_IOWAIT),
    _row(r.MEMORY, r.MEM_UTIL),
    _row("gpu0", r.GPU_UTIL, "gpu*"),
    _row("gpu0", r.GPU_MEM_UTIL, "gpu*"),
    _row(r.DISK, r.DISK_READ_BPS),
    _row(r.DISK, r.DISK_WRITE_BPS),
    _row(r.NET, r.NET_RX_BPS),
    _row(r.NET, r.NET_TX_BPS),
    _row(r.PROC, r.PROC_CPU_UTIL),
    _row(r.PROC, r.PROC_RSS_BYTES),
    _row(r.PROC, r.WORKERS_ALIVE),
    _row(r.PROC, r.WORKERS_CPU_UTIL),
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
    """Snapshots per node (distinct timestamps) and the time they cover, from a tidy table."""
    out = []
    for node in _nodes(table):
        ts = np.unique(table.filter(pc.equal(table["node"], node))["timestamp_us"].to_numpy())
        if len(ts):
            out.append(NodeSpan(node, int(len(ts)), int(ts[0]), int(ts[-1])))
    return out


def node_span_wide(node: str, wide: pa.Table) -> NodeSpan | None:
    """The same from one node's wide table (`Run.system_wide`)."""
    ts = wide[TIMESTAMP].to_numpy()
    return NodeSpan(node, int(len(ts)), int(ts.min()), int(ts.max())) if len(ts) else None


def usage_metrics() -> set[str]:
    """The metrics the usage statistics need: read only these from long runs."""
    return {metric for _, _, metric, _ in USAGE_ROWS}


def usage_stats(table: pa.Table) -> list[UsageStat]:
    """Mean, median, p95 and max per node for each row of USAGE_ROWS present in a tidy table."""
    out: list[UsageStat] = []
    for node in _nodes(table):
        out += _stats(node, _pivot(table.filter(pc.equal(table["node"], node))))
    return out


def usage_stats_wide(node: str, wide: pa.Table) -> list[UsageStat]:
    """The same from one node's wide table (`Run.system_wide`): no tidy rows are ever built."""
    return _stats(node, {name: wide[name].to_numpy(zero_copy_only=False)
                         for name in wide.column_names if name != TIMESTAMP})


def _stats(node: str, columns: dict[str, np.ndarray]) -> list[UsageStat]:
    """`columns`: `device/metric` -> values per snapshot, aligned, NaN where missing."""
    keys = {name: MetricKey.from_column(name) for name in columns}
    out: list[UsageStat] = []
    for label, selector, metric, unit in USAGE_ROWS:
        picked = [columns[n] for n, k in keys.items() if k.metric == metric and _matches(k.device, selector)]
        if not picked:
            continue
        block = np.column_stack(picked).astype(np.float64, copy=False)
        if label == "CPU busiest core":
            has = ~np.isnan(block).all(axis=1)
            v = np.nanmax(block[has], axis=1) if has.any() else np.empty(0)
        else:
            v = block.ravel()
            v = v[~np.isnan(v)]
        if not len(v):
            continue
        p50, p95 = np.percentile(v, [50, 95])
        out.append(UsageStat(node, label, unit, float(v.mean()), float(p50), float(p95), float(v.max()), len(v)))
    return out


def _matches(device: str, selector: str) -> bool:
    if selector.endswith("*"):
        prefix = selector[:-1]
        return device.startswith(prefix) and device[len(prefix):].isdigit()
    return device == selector


def _pivot(tidy: pa.Table) -> dict[str, np.ndarray]:
    """One node's tidy rows as aligned `device/metric` columns (NaN where a snapshot lacks a value)."""
    ts = tidy["timestamp_us"].to_numpy()
    stamps, row = np.unique(ts, return_inverse=True)
    devices = tidy["device"].cast(pa.string()).to_numpy(zero_copy_only=False)
    metrics = tidy["metric"].cast(pa.string()).to_numpy(zero_copy_only=False)
    values = tidy["value"].to_numpy(zero_copy_only=False)
    names = np.char.add(np.char.add(devices.astype(str), COLUMN_SEP), metrics.astype(str))
    out: dict[str, np.ndarray] = {}
    for name in np.unique(names):
        mask = names == name
        col = np.full(len(stamps), np.nan)
        col[row[mask]] = values[mask]
        out[str(name)] = col
    return out


def _nodes(table: pa.Table) -> list[str]:
    if table.num_rows == 0:
        return []
    return sorted(pc.unique(table["node"].cast(pa.string())).to_pylist())
