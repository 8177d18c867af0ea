"""Utilization heatmap (the deep-profiling blog's view): per node, every GPU and every CPU core a row, time as x,
colour = mean utilization in each time bucket, so a GPU that stalls while cores are saturated stands out."""

from __future__ import annotations

from typing import Any

import numpy as np
from bokeh.layouts import gridplot
from bokeh.models import DataRange1d

from stallwatch.present import charts
from stallwatch.present.charts import HeatRows
from stallwatch.present.downsample import minmax_matrix
from stallwatch.present.report.model import Chart, NotApplicable, Paragraph, Section
from stallwatch.present.report.sections.timeline import METRICS
from stallwatch.records import CPU_IOWAIT, CPU_UTIL, GPU_MEM_UTIL, GPU_UTIL

CELL_BUDGET = 250_000  # cells over all nodes' heatmaps, one byte each
MIN_BUCKETS, MAX_BUCKETS = 200, 1500
# dimension -> (device prefix, metric, row label suffix); rows appear in this order, GPUs first as in the blog
DIMENSIONS = {"GPU": ("gpu", GPU_UTIL, ""), "CPU": ("cpu", CPU_UTIL, ""),
              "GPU memory": ("gpu", GPU_MEM_UTIL, " memory"), "I/O": ("cpu", CPU_IOWAIT, " I/O wait")}
DEFAULT_DIMENSIONS = ("GPU", "CPU")

INTRO = ("Every GPU and every CPU core of a node is a row; the x-axis is the duration of the job and the colour "
         "is the mean utilization in each time bucket (yellow: fully busy, purple: idle, grey: no data). It makes "
         "CPU bottlenecks easy to spot: GPUs that drop to low utilization while one or more cores are at their "
         "maximum are waiting for data that the CPUs prepare too slowly (for example too heavy preprocessing). "
         "Scroll to zoom, hover for a row's value.")


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


def figures(frames: dict[str, Any], dimensions: tuple[str, ...] = DEFAULT_DIMENSIONS) -> list[Any]:
    """One heatmap per node that has rows, sharing one time axis."""
    counts = {node: len(row_columns(f, dimensions)) for node, f in frames.items() if len(f)}
    buckets = buckets_for(sum(counts.values()))
    x_range = DataRange1d(range_padding=0)
    out = []
    for node, frame in frames.items():
        if not counts.get(node):
            continue
        rows = heat_rows(frame, buckets, dimensions)
        if rows is not None:
            out.append(charts.heatmap(rows, title=f"{node}: utilization per GPU and CPU core", x_range=x_range))
    return out


def stack(figs: list[Any]) -> Any:
    """Figures one under the other with one toolbar (their time axes are shared already)."""
    return gridplot([[f] for f in figs], merge_tools=True, toolbar_location="right", sizing_mode="stretch_width")


def build(ctx: Any) -> list[Section]:
    section = Section("heatmap", "Utilization heatmap", [Paragraph(INTRO)])
    frames = {node: ctx.system(node, METRICS) for node in ctx.nodes}
    shown = figures(frames)
    if not shown:
        section.blocks.append(NotApplicable("No node recorded per-core CPU or GPU utilization, so there is no "
                                            "heatmap to show."))
        return [section]
    gpu_less = [n for n, f in frames.items() if len(f) and not f.devices("gpu", GPU_UTIL)]
    if gpu_less:
        section.blocks.append(Paragraph(f"No GPU recorded on {', '.join(gpu_less)}: only CPU cores are shown there."))
    model = shown[0] if len(shown) == 1 else stack(shown)
    section.blocks.append(Chart(model, "Utilization per GPU and CPU core over time"))
    return [section]
