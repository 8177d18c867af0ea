"""Utilization heatmap (the deep-profiling blog's view): per node, every GPU and every CPU core a row, time as x,
colour = mean utilization in each time bucket, so a GPU that stalls while cores are saturated stands out. The
rows come from the analysis (`analyze/heatmap.py`); this draws them on one shared time axis."""

from __future__ import annotations

from typing import Any


from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.series import HeatRows
from stallwatch.present import charts
from stallwatch.present.report.model import Chart, NotApplicable, Paragraph, Section

INTRO = ("Every GPU and every CPU core of a node is a row; the x-axis is the duration of the job and the colour "
         "is the mean utilization in each time bucket (yellow: fully busy, purple: idle, blank: no snapshot). It makes "
         "CPU bottlenecks easy to spot: GPUs that drop to low utilization while one or more cores are at their "
         "maximum are waiting for data that the CPUs prepare too slowly (for example too heavy preprocessing). "
         "Scroll to zoom, hover for a row's value.")


def figures(rows: dict[str, HeatRows]) -> list[Any]:
    """One heatmap per node, sharing one time axis."""
    return [charts.heatmap(r, title=f"{node}: utilization per GPU and CPU core")
            for node, r in rows.items()]


def stack(figs: list[Any]) -> Any:
    """Heatmaps one under the other, sharing one time axis."""
    return charts.grid(figs, ncols=1, share_x=True)


def build(analysis: RunAnalysis) -> list[Section]:
    section = Section("heatmap", "Utilization heatmap", [Paragraph(INTRO)])
    drawn = analysis.drawn_nodes()
    heatmaps = analysis.heatmaps(node_names=drawn)
    shown = figures(heatmaps)
    if not shown:
        section.blocks.append(NotApplicable("No node recorded per-core CPU or GPU utilization, so there is no "
                                            "heatmap to show."))
        return [section]
    gpu_less = [n for n, rows in heatmaps.items() if not any(name.startswith("gpu") for name in rows.names)]
    if gpu_less:
        section.blocks.append(Paragraph(f"No GPU recorded on {', '.join(gpu_less)}: only CPU cores are shown there."))
    if len(drawn) < len(analysis.nodes):
        section.blocks.append(Paragraph(
            f"{len(drawn)} of the {len(analysis.nodes)} nodes are drawn: those the findings name first, then those "
            "that stand out in the node comparison, then by name (the notebook's and the dashboard's heatmap draw "
            "any node)."))
    model = shown[0] if len(shown) == 1 else stack(shown)
    section.blocks.append(Chart(model, "Utilization per GPU and CPU core over time"))
    return [section]
