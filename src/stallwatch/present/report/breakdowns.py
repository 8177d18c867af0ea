"""Breakdown chart specs of the report's first sections (pies of where time went, bars per device): hover for
exact values, a legend whose entries hide their series on click (drawn by draw.js). (Time lines, heatmaps and
histograms are in `stallwatch.present.charts`.)"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from stallwatch import catalogue
from stallwatch.present.charts import BarSeries, BarsSpec, PieSpec, Slice

OTHERS_COLOR = catalogue.OTHERS_COLOUR
UNNAMED = "(unnamed)"  # a slice whose name is empty still gets a legend entry
LEGEND_CHARS = 38  # a longer name is cut in the legend (the hover shows it whole)


def short(name: str, limit: int = LEGEND_CHARS) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "…"


def pie(values: Mapping[str, float], *, title: str = "", unit: str = "", top: int | None = None, rest: float = 0.0,
        others: str = "others", size: int = 240) -> PieSpec:
    """A pie of `values` (label -> amount in `unit`, e.g. seconds), largest first; with `top`, the others, and
    `rest` (an amount not itemized in `values`), are one grey `others` wedge. Each wedge has its own legend
    entry, which hides it; one wedge alone is said in a sentence."""
    items = [(str(k).strip() or UNNAMED, float(v)) for k, v in values.items()
             if v is not None and math.isfinite(v) and float(v) > 0]
    items.sort(key=lambda kv: -kv[1])
    if top is not None and len(items) > top:
        rest += sum(v for _, v in items[top:])
        items = items[:top]
    slices = [Slice(label, value) for label, value in items]
    if rest > 0:
        slices.append(Slice(others, rest, OTHERS_COLOR))
    return PieSpec(title=title, slices=slices, unit=unit, size=size,
                   na="" if slices else f"not applicable: {title or 'this breakdown'} has nothing to show")


def device_bars(devices: Sequence[str], stats: Sequence[Mapping[str, float]], *, title: str, unit: str = "%",
                height: int = 280) -> BarsSpec:
    """Per device (cores, GPUs): the median as a bar, p95 and max as markers; hover gives all five numbers."""
    col = {key: [float(s.get(key, math.nan)) for s in stats] for key in ("max", "p99", "p95", "p50", "min")}
    width = min(1000, max(420, 260 + 46 * len(devices)))  # bars of a readable width (and title), any number
    return BarsSpec(title=title, height=height, width=width, categories=list(devices), y_label=unit,
                    series=[BarSeries("p50", col["p50"], catalogue.PLAIN_COLOUR)],
                    points=[BarSeries("p95", col["p95"], catalogue.SERIES_PALETTE[1], "diamond"),
                            BarSeries("max", col["max"], catalogue.HIGHLIGHT_COLOUR, "triangle")],
                    tips=col)
