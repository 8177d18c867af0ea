"""The chart specs of the "Analyzing the training loop" subsections, drawn from aggregates only (histogram
bins, box-plot statistics, shares), so a report of an 8-node day stays small: box plots and histograms here,
pies from the report's shared `breakdowns.pie`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from stallwatch.present.charts import BoxSpec, HistMarks, HistogramSpec, HistSeries, PieSpec
from stallwatch.present.report.breakdowns import pie as shared_pie

BOX_KEYS = ("lower", "p25", "p50", "p75", "upper")


def histogram(title: str, x_label: str, series: Sequence[tuple[str, Sequence[float], Sequence[float]]], *,
              y_label: str = "Share of values", markers: Sequence[tuple[str, Sequence[float], Sequence[Any]]] = (),
              marker_label: str = "value", log_x: bool = False, x_range: tuple[float, float] | None = None
              ) -> HistogramSpec:
    """One bar per non-empty bin of each series `(label, probs, binedges)`, each series its own legend entry
    (click to hide); `markers` `(label, xs, names)` are drawn as red ticks at the bottom (e.g. outlier steps)."""
    out = HistogramSpec(title=title, height=340, x_label=x_label, y_label=y_label, share=True, log_x=log_x,
                        x_range=x_range, marker_label=marker_label)
    for label, probs, edges in series:
        p = np.asarray(probs, dtype=np.float64)
        e = np.asarray(edges, dtype=np.float64)
        keep = np.flatnonzero(p > 0)
        out.series.append(HistSeries(label, e[keep], e[keep + 1], p[keep]))
    for label, xs, names in markers:
        out.markers.append(HistMarks(f"{label}: outliers", [float(x) for x in xs], [str(n) for n in names]))
    return out


def box_plot(title: str, boxes: Sequence[tuple[str, dict[str, float]]], *, y_label: str = "Utilization in %") -> BoxSpec:
    """Box plots from statistics (`lower`, `p25`, `p50`, `p75`, `upper`, optional `p95`/`max`), one per label:
    whiskers from lower to upper, the box split at the median. No raw points."""
    boxes = [(label, stats) for label, stats in boxes if all(k in stats for k in BOX_KEYS)]
    out = BoxSpec(title=title, height=340, categories=[label for label, _ in boxes], y_label=y_label)
    for key in (*BOX_KEYS, "p95", "max"):
        setattr(out, key, [float(stats[key]) if stats.get(key) is not None else math.nan for _, stats in boxes])
    return out


def pie(title: str, shares: dict[str, float], *, unit: str = "") -> PieSpec:
    """A pie of `shares` (any positive amounts, in `unit`), the report's shared kind."""
    return shared_pie(shares, title=title, unit=unit)
