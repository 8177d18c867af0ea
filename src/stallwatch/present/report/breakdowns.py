"""Breakdown charts of the report's first sections (pies of where time went, bars per device), built alike:
hover for exact values, a legend whose entries hide their series on click, no logo, nothing loaded. (Time
lines, heatmaps and histograms are in `stallwatch.present.charts`.)"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem
from bokeh.plotting import figure

from stallwatch import catalogue

OTHERS_COLOR = catalogue.OTHERS_COLOUR
UNNAMED = "(unnamed)"  # a slice whose name is empty still gets a legend entry
LEGEND_CHARS = 38  # a longer name is cut in the legend (the hover shows it whole)


def short(name: str, limit: int = LEGEND_CHARS) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "…"


def finish(p: Any) -> Any:
    """What every report chart shares: no Bokeh logo (a link off the page), a quiet outline."""
    p.toolbar.logo = None
    p.outline_line_color = None
    return p


def pie(values: Mapping[str, float], *, title: str = "", unit: str = "", top: int | None = None, rest: float = 0.0,
        others: str = "others", size: int = 240) -> Any:
    """A pie of `values` (label -> amount in `unit`, e.g. seconds), largest first; with `top`, the others, and
    `rest` (an amount not itemized in `values`), are one grey `others` wedge. Each wedge is its own renderer,
    so its legend entry hides it."""
    items = [(str(k).strip() or UNNAMED, float(v)) for k, v in values.items()
             if v is not None and math.isfinite(v) and float(v) > 0]
    items.sort(key=lambda kv: -kv[1])
    if top is not None and len(items) > top:
        rest += sum(v for _, v in items[top:])
        items = items[:top]
    grey = len(items) if rest > 0 else -1
    if rest > 0:
        items.append((others, rest))
    total = sum(v for _, v in items) or 1.0
    p = figure(frame_width=size, frame_height=size, title=title or None, tools="pan,wheel_zoom,reset,save",
               x_range=(-1.05, 1.05), y_range=(-1.05, 1.05), toolbar_location="below")
    legend = []
    start = math.pi / 2  # clockwise from twelve o'clock, as pies are read
    colors = catalogue.colours([label for label, _ in items])  # a phase's own colour, whatever its place
    for i, (label, value) in enumerate(items):
        angle = 2 * math.pi * value / total
        color = OTHERS_COLOR if i == grey else colors[label]
        source = ColumnDataSource({"label": [label], "value": [value], "share": [100.0 * value / total]})
        r = p.wedge(x=0, y=0, radius=1.0, start_angle=start - angle, end_angle=start, source=source,
                    fill_color=color, line_color="white", line_width=1.5)
        start -= angle
        legend.append(LegendItem(label=short(label), renderers=[r]))
    tips = [("", "@label"), ("share", "@share{0.0} %")]
    if unit:
        tips.append((unit, "@value{0,0.[00]}"))
    p.add_tools(HoverTool(tooltips=tips))
    p.add_layout(Legend(items=legend, click_policy="hide", label_text_font_size="9pt", spacing=2), "right")
    p.axis.visible = False
    p.grid.grid_line_color = None
    return finish(p)


def device_bars(devices: Sequence[str], stats: Sequence[Mapping[str, float]], *, title: str, unit: str = "%",
                height: int = 280) -> Any:
    """Per device (cores, GPUs): the median as a bar, p95 and max as markers; hover gives all five numbers."""
    data: dict[str, list[Any]] = {"device": list(devices)}
    for key in ("max", "p99", "p95", "p50", "min"):
        data[key] = [float(s.get(key, math.nan)) for s in stats]
    source = ColumnDataSource(data)
    width = min(1000, 260 + 46 * len(devices))  # bars of a readable width, whatever the number of devices
    p = figure(x_range=list(devices), width=width, height=height, title=title, tools="xpan,xwheel_zoom,reset,save",
               toolbar_location="below", y_axis_label=unit)
    series = [
        p.vbar(x="device", top="p50", width=0.7, source=source, fill_color=catalogue.PLAIN_COLOUR, line_color=None,
               alpha=0.8),
        p.scatter(x="device", y="p95", source=source, size=8, marker="diamond", color=catalogue.SERIES_PALETTE[1]),
        p.scatter(x="device", y="max", source=source, size=7, marker="triangle", color=catalogue.HIGHLIGHT_COLOUR),
    ]
    p.add_layout(Legend(items=[LegendItem(label=n, renderers=[r]) for n, r in zip(("p50", "p95", "max"), series)],
                        click_policy="hide", label_text_font_size="9pt"), "right")
    p.add_tools(HoverTool(renderers=[series[0]], tooltips=[("", "@device"), ("max", "@max{0.0}"),
                                                          ("p99", "@p99{0.0}"), ("p95", "@p95{0.0}"),
                                                          ("p50", "@p50{0.0}"), ("min", "@min{0.0}")]))
    p.y_range.start = 0
    p.xaxis.major_label_orientation = math.pi / 4 if len(devices) > 16 else 0
    p.xgrid.grid_line_color = None
    return finish(p)
