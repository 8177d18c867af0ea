"""The utilization heatmap's data (the deep-profiling blog's view): per node, every GPU and CPU core a row,
time bucketed into columns of mean utilization, so a GPU that stalls while cores are saturated stands out."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from stallwatch.analyze.downsample import minmax_matrix
from stallwatch.analyze.series import HeatRows
from stallwatch.records import CPU_IOWAIT, CPU_UTIL, GPU_MEM_UTIL, GPU_UTIL

CELL_BUDGET = 250_000  # cells over all nodes' heatmaps, one byte each
MIN_BUCKETS, MAX_BUCKETS = 200, 1500
# dimension -> (device prefix, metric, row label suffix); rows appear in this order, GPUs first as in the blog
DIMENSIONS = {"GPU": ("gpu", GPU_UTIL, ""), "CPU": ("cpu", CPU_UTIL, ""),
              "GPU memory": ("gpu", GPU_MEM_UTIL, " memory"), "I/O": ("cpu", CPU_IOWAIT, " I/O wait")}
DEFAULT_DIMENSIONS = ("GPU", "CPU")


def row_columns(frame: Any, dimensions: tuple[str, ...] = DEFAULT_DIMENSIONS, *,
                total: bool = False) -> list[tuple[str, np.ndarray]]:
    """(row name, values) of a node: per dimension its numbered devices in number order (gpu0…, cpu0…), after
    the node-wide `cpu` device ("cpu total") when `total`."""
    rows = []
    for dim in dimensions:
        if dim not in DIMENSIONS:
            raise ValueError(f"unknown heatmap dimension {dim!r}; choose from {', '.join(DIMENSIONS)}")
        prefix, metric, suffix = DIMENSIONS[dim]
        if total and frame.get(prefix, metric) is not None:
            rows.append((f"{prefix} total{suffix}", frame.get(prefix, metric)))
        for device in frame.devices(prefix, metric):
            rows.append((device + suffix, frame.get(device, metric)))
    return rows


def heat_rows(frame: Any, buckets: int, dimensions: tuple[str, ...] = DEFAULT_DIMENSIONS,
              rows: list[tuple[str, np.ndarray]] | None = None) -> HeatRows | None:
    """A node's rows (`row_columns` unless given) bucketed to at most `buckets` columns of mean utilization;
    None without rows."""
    rows = row_columns(frame, dimensions) if rows is None else rows
    if not rows or len(frame) == 0:
        return None
    matrix = np.empty((len(frame), len(rows)), dtype=np.float32, order="F")
    for j, (_, values) in enumerate(rows):
        matrix[:, j] = values
    b = minmax_matrix(frame.timestamps, matrix, buckets)
    return HeatRows([name for name, _ in rows], int(b.start[0]), b.width, np.ascontiguousarray(b.mean.T))


def buckets_for(total_rows: int) -> int:
    return int(np.clip(CELL_BUDGET // max(1, total_rows), MIN_BUCKETS, MAX_BUCKETS))


def node_heatmaps(frames: dict[str, Any] | Iterable[tuple[str, Any]],
                  dimensions: tuple[str, ...] = DEFAULT_DIMENSIONS, *,
                  rows_total: int | None = None) -> dict[str, HeatRows]:
    """Every node's heatmap rows, bucketed so that all nodes together stay within CELL_BUDGET cells; nodes
    without rows are left out. With `rows_total` (the rows of all nodes, known from the stored series) the
    frames may be (node, snapshots) pairs made one at a time: one node's snapshots are in memory at once."""
    if rows_total is None:
        frames = dict(frames)
        rows_total = sum(len(row_columns(f, dimensions)) for f in frames.values() if len(f))
    buckets = buckets_for(rows_total)
    out = {}
    for node, frame in (frames.items() if isinstance(frames, dict) else frames):
        if len(frame):
            rows = heat_rows(frame, buckets, dimensions)
            if rows is not None:
                out[node] = rows
    return out
