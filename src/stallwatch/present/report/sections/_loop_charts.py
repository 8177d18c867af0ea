"""The Bokeh charts of the "Analyzing the training loop" subsections, drawn from aggregates only (histogram
bins, box-plot statistics, shares), so a report of an 8-node day stays small: box plots and histograms here,
pies from the report's shared `breakdowns.pie`."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Range1d, Whisker
from bokeh.plotting import figure

from stallwatch import catalogue
from stallwatch.present.report.breakdowns import finish
from stallwatch.present.report.breakdowns import pie as shared_pie

TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
BOX_KEYS = ("lower", "p25", "p50", "p75", "upper")


def histogram(title: str, x_label: str, series: Sequence[tuple[str, Sequence[float], Sequence[float]]], *,
              y_label: str = "Share of values", markers: Sequence[tuple[str, Sequence[float], Sequence[Any]]] = (),
              marker_label: str = "value", log_x: bool = False, x_range: tuple[float, float] | None = None) -> Any:
    """One quad per non-empty bin of each series `(label, probs, binedges)`, each series its own legend entry
    (click to hide); `markers` `(label, xs, names)` are drawn as red ticks at the bottom (e.g. outlier steps)."""
    extra: dict[str, Any] = {"x_range": x_range} if x_range is not None else {}
    fig = figure(title=title, height=340, sizing_mode="stretch_width", tools=TOOLS, x_axis_label=x_label,
                 y_axis_label=y_label, x_axis_type="log" if log_x else "linear", **extra)
    quads = []
    colors = catalogue.colours([label for label, _, _ in series])
    for label, probs, edges in series:
        color = colors[label]
        p = np.asarray(probs, dtype=np.float64)
        e = np.asarray(edges, dtype=np.float64)
        keep = np.flatnonzero(p > 0)
        src = ColumnDataSource({"left": e[keep], "right": e[keep + 1], "top": p[keep],
                                "series": [label] * len(keep)})
        quads.append(fig.quad(left="left", right="right", top="top", bottom=0, source=src, fill_color=color,
                              fill_alpha=0.55, line_color="white", legend_label=label))
    fig.add_tools(HoverTool(renderers=quads, tooltips=[("", "@series"), ("from", "@left"), ("to", "@right"),
                                                       ("share", "@top{0.0%}")]))
    ticks = []
    for label, xs, names in markers:
        src = ColumnDataSource({"x": list(xs), "y": [0.0] * len(xs), "name": [str(n) for n in names],
                                "series": [label] * len(xs)})
        ticks.append(fig.scatter(x="x", y="y", source=src, marker="triangle", size=9, color=catalogue.HIGHLIGHT_COLOUR,
                                 legend_label=f"{label}: outliers"))
    if ticks:
        fig.add_tools(HoverTool(renderers=ticks, tooltips=[("", "@series"), (marker_label, "@name"), ("", "@x")]))
    fig.y_range.start = 0
    _legend(fig)
    return finish(fig)


def box_plot(title: str, boxes: Sequence[tuple[str, dict[str, float]]], *, y_label: str = "Utilization in %") -> Any:
    """Box plots from statistics (`lower`, `p25`, `p50`, `p75`, `upper`, optional `p95`/`max`), one per label:
    whiskers from lower to upper, the box split at the median. No raw points."""
    boxes = [(label, stats) for label, stats in boxes if all(k in stats for k in BOX_KEYS)]
    labels = [label for label, _ in boxes]
    data: dict[str, list[Any]] = {"label": labels}
    for key in (*BOX_KEYS, "p95", "max"):
        data[key] = [float(stats[key]) if stats.get(key) is not None else math.nan for _, stats in boxes]
    src = ColumnDataSource(data)
    fig = figure(title=title, x_range=FactorRange(*labels), y_range=_whisker_range(data), height=340,
                 sizing_mode="stretch_width", tools=TOOLS, y_axis_label=y_label)
    fig.add_layout(Whisker(base="label", upper="upper", lower="lower", source=src, line_color="black"))
    upper = fig.vbar(x="label", width=0.7, top="p75", bottom="p50", source=src, fill_color=catalogue.HEAT_PALETTE[-1],
                     line_color="black")
    lower = fig.vbar(x="label", width=0.7, top="p50", bottom="p25", source=src, fill_color=catalogue.HEAT_PALETTE[0],
                     line_color="black")
    fig.add_tools(HoverTool(renderers=[upper, lower], tooltips=[
        ("", "@label"), ("upper whisker", "@upper{0.0}"), ("p95", "@p95{0.0}"), ("p75", "@p75{0.0}"),
        ("median", "@p50{0.0}"), ("p25", "@p25{0.0}"), ("lower whisker", "@lower{0.0}")]))
    fig.xgrid.grid_line_color = None
    return finish(fig)


def _whisker_range(data: dict[str, list[Any]]) -> Range1d:
    """From the lowest to the highest whisker, padded (a Whisker annotation does not widen an automatic range)."""
    values = [v for k in ("lower", "upper") for v in data[k] if math.isfinite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 100.0)
    pad = max((hi - lo) * 0.06, 0.5)
    return Range1d(lo - pad, hi + pad)


def pie(title: str, shares: dict[str, float], *, unit: str = "") -> Any:
    """A pie of `shares` (any positive amounts, in `unit`), the report's shared kind."""
    return shared_pie(shares, title=title, unit=unit)


def _legend(fig: Any) -> None:
    if fig.legend:
        fig.legend.click_policy = "hide"
        fig.legend.label_text_font_size = "9pt"
        fig.add_layout(fig.legend[0], "right")
