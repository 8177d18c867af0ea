"""Plain data that analyses hand to renderers: downsampled lines, shaded time ranges, flagged moments,
heatmap rows and histograms. No drawing here; `present/charts.py` draws them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Series:
    """One line: `values` at `ts` (µs), already downsampled."""
    name: str
    ts: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class Panel:
    """One figure of a stacked timeline: its lines, title and y axis."""
    title: str
    y_label: str
    series: list[Series]
    y_format: str = "0.0"  # Bokeh number format of the hover value
    percent: bool = False  # a 0-100 axis


@dataclass(frozen=True)
class Span:
    """A shaded time range (a training phase, a bottleneck); `label` groups spans into one legend entry."""
    start_us: int
    end_us: int
    label: str
    text: str = ""


@dataclass(frozen=True)
class Marker:
    """A flagged moment drawn as a vertical line (an outlier step…); `label` is its legend entry."""
    at_us: int
    label: str
    text: str = ""


@dataclass(frozen=True)
class HeatRows:
    """Rows of a heatmap on a regular time grid: `values` is rows × buckets, percent, NaN where empty."""
    names: list[str]
    start_us: int
    width_us: int
    values: np.ndarray


@dataclass(frozen=True)
class Hist:
    """One histogram: `counts` per bin between consecutive `edges`."""
    name: str
    edges: np.ndarray
    counts: np.ndarray
