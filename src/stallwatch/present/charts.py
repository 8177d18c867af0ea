"""Chart specs shared by the report and the notebook views (the dashboard draws the same kinds): typed records
of aggregated data (already downsampled, binned or bucketed) that `static/draw.js` draws with BokehJS in the
browser. Building one is cheap (no Bokeh in Python); `to_json()` is what the page carries. Timestamps come in
as int64 µs and go out as epoch milliseconds. Colours are resolved by draw.js from the catalogue, so a phase
has one colour on every face; `colors` overrides name one explicitly."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from stallwatch import catalogue
from stallwatch.analyze.series import HeatRows, Hist, Marker, Panel, Span

NO_DATA_COLOR = catalogue.NO_DATA_COLOUR
HEAT_PALETTE = list(catalogue.HEAT_PALETTE)  # the dashboard's heatmaps use the same


def _plain(value: Any) -> Any:
    """A spec's field as JSON: arrays as lists, NaN/inf as null, records as dicts."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            out = value.astype(np.float64)
            finite = np.isfinite(out)
            return out.tolist() if finite.all() else np.where(finite, out, None).tolist()
        return value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (np.floating, np.integer)):
        return _plain(value.item())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(v) for f in fields(value) if (v := getattr(value, f.name)) is not None}
    return value


@dataclass
class ChartSpec:
    """What every chart spec has: its kind (draw.js's builder), a title, and why it is empty when it is."""
    title: str = ""
    na: str = ""  # "not applicable: why", shown instead of a chart when there is no data
    height: int | None = None
    kind: str = ""

    def to_json(self) -> dict[str, Any]:
        out = _plain(self)
        return {k: v for k, v in out.items() if v is not None and v != "" and v != [] and v != {}}


@dataclass
class Line:
    name: str
    x: np.ndarray
    y: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    color: str | None = None


@dataclass
class PanelSpec:
    title: str
    y_label: str = ""
    lines: list[Line] = field(default_factory=list)
    percent: bool = False
    hlines: list[dict[str, Any]] = field(default_factory=list)
    height: int | None = None


@dataclass
class Ranges:
    """Spans, flags (x0/x1) or markers (x) of one label, stored once for every panel."""
    label: str
    x0: np.ndarray | None = None
    x1: np.ndarray | None = None
    x: np.ndarray | None = None
    text: list[str] = field(default_factory=list)


@dataclass
class Track:
    """One rank's phase blocks: [x0, x1) coloured by phase."""
    name: str
    x0: np.ndarray
    x1: np.ndarray
    phase: list[str]


@dataclass
class TimeSpec(ChartSpec):
    panels: list[PanelSpec] = field(default_factory=list)
    spans: list[Ranges] = field(default_factory=list)
    flags: list[Ranges] = field(default_factory=list)
    markers: list[Ranges] = field(default_factory=list)
    tracks: list[Track] = field(default_factory=list)
    colors: dict[str, str] = field(default_factory=dict)
    x_type: str = "datetime"  # or "linear" (x_label says what: "step")
    x_label: str = ""
    panel_height: int | None = None
    brush: bool = False
    shade: list[str] = field(default_factory=list)  # labels of flags also shaded in every panel
    kind: str = "time"


@dataclass
class HeatmapSpec(ChartSpec):
    rows: list[str] = field(default_factory=list)
    x0: float = 0.0
    dx: float = 1.0
    values: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    low: float = 0.0
    high: float = 100.0
    unit: str = "%"
    highlight: list[str] = field(default_factory=list)
    kind: str = "heatmap"


@dataclass
class BarSeries:
    name: str
    values: list[float]
    color: str | None = None
    marker: str | None = None


@dataclass
class BarsSpec(ChartSpec):
    categories: list[str] = field(default_factory=list)
    series: list[BarSeries] = field(default_factory=list)
    points: list[BarSeries] = field(default_factory=list)
    tips: dict[str, list[float]] = field(default_factory=dict)
    highlight: list[str] = field(default_factory=list)
    stacked: bool = False
    y_label: str = ""
    width: int | None = None
    kind: str = "bars"


@dataclass
class HistSeries:
    name: str
    left: np.ndarray
    right: np.ndarray
    top: np.ndarray


@dataclass
class HistMarks:
    name: str
    x: list[float]
    text: list[str]


@dataclass
class HistogramSpec(ChartSpec):
    series: list[HistSeries] = field(default_factory=list)
    markers: list[HistMarks] = field(default_factory=list)
    x_label: str = ""
    y_label: str = "count"
    share: bool = False
    log_x: bool = False
    x_range: tuple[float, float] | None = None
    marker_label: str = ""
    colors: dict[str, str] = field(default_factory=dict)
    kind: str = "histogram"


@dataclass
class Slice:
    label: str
    value: float
    color: str | None = None


@dataclass
class PieSpec(ChartSpec):
    slices: list[Slice] = field(default_factory=list)
    unit: str = ""
    size: int = 240
    kind: str = "pie"


@dataclass
class BoxSpec(ChartSpec):
    categories: list[str] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    p25: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p75: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    p95: list[float] = field(default_factory=list)
    max: list[float] = field(default_factory=list)
    y_label: str = ""
    kind: str = "box"


@dataclass
class GridSpec(ChartSpec):
    children: list[ChartSpec] = field(default_factory=list)
    ncols: int = 1
    share_x: bool = False
    kind: str = "grid"

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in super().to_json().items() if k != "children"}
        out["children"] = [c.to_json() for c in self.children]
        return out


def ms(ts_us: np.ndarray | int | Sequence[int]) -> Any:
    """µs since the epoch -> the charts' datetime unit (ms, float64)."""
    return np.asarray(ts_us, dtype=np.int64) / 1000.0


def palette(n: int) -> list[str]:
    """Colours for `n` lines that are no phase (nodes, devices), in order: the catalogue's series palette."""
    return [catalogue.SERIES_PALETTE[i % len(catalogue.SERIES_PALETTE)] for i in range(n)]


def _ranges(spans: Sequence[Span]) -> list[Ranges]:
    out = []
    for label in dict.fromkeys(s.label for s in spans):
        mine = [s for s in spans if s.label == label]
        out.append(Ranges(label, x0=ms([s.start_us for s in mine]), x1=ms([s.end_us for s in mine]),
                          text=[s.text or label for s in mine]))
    return out


def _marks(markers: Sequence[Marker]) -> list[Ranges]:
    out = []
    for label in dict.fromkeys(m.label for m in markers):
        mine = [m for m in markers if m.label == label]
        out.append(Ranges(label, x=ms([m.at_us for m in mine]), text=[m.text or label for m in mine]))
    return out


def timeline(panels: Sequence[Panel], *, spans: Sequence[Span] = (), flags: Sequence[Span] = (),
             markers: Sequence[Marker] = (), height: int = 200, colors: dict[str, str] | None = None,
             shade: Sequence[str] = ()) -> TimeSpec:
    """Stacked time-line panels sharing one zoomable datetime x axis. `spans` (training phases) are shaded in
    every panel; `flags` (flagged ranges: bottlenecks) are bars in a "Flagged" track on top, where `markers`
    (flagged moments: outlier steps) are points; the flags labelled in `shade` are shaded in the panels too. One
    legend lists every line, span and flag group; a click hides it in every panel."""
    out = TimeSpec(title="", spans=_ranges(spans), flags=_ranges(flags), markers=_marks(markers),
                   colors=dict(colors or {}), panel_height=height, shade=list(dict.fromkeys(shade)))
    for p in panels:
        lines = [Line(s.name, ms(s.ts), np.asarray(s.values, dtype=np.float32)) for s in p.series]
        out.panels.append(PanelSpec(p.title, p.y_label, lines, percent=p.percent))
    if not any(len(line.x) for p in out.panels for line in p.lines):
        out.na = "not applicable: no samples in this run"
    return out


def _even_columns(values: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Columns with a snapshot every k-th column (sampling slower than the column width): those columns only,
    k columns wide, so evenly spaced snapshots read as one band, not stripes. (values, first, k)"""
    filled = np.flatnonzero(~np.isnan(values).all(axis=0)) if values.size else np.array([], dtype=np.int64)
    if len(filled) < 3:
        return values, 0, 1
    k = int(np.gcd.reduce(np.diff(filled)))
    if k <= 1:
        return values, 0, 1
    first = int(filled[0])
    return values[:, first::k], first, k


def heatmap(rows: HeatRows, *, title: str, height: int | None = None, x_range: Any = None) -> HeatmapSpec:
    """Every row (a GPU, a core) a band, time as x, colour = utilization (%); a column without a snapshot is a
    gap. (`x_range` is kept for callers; a grid with share_x links heatmaps' time axes.)"""
    values = np.clip(np.asarray(rows.values, dtype=np.float64), 0, 100)
    values, first, k = _even_columns(values)
    return HeatmapSpec(title=title, height=height, rows=list(rows.names),
                       x0=float(ms(rows.start_us + first * rows.width_us)), dx=k * rows.width_us / 1000.0,
                       values=np.round(values, 2), na="" if values.size else "not applicable: no samples")


def step_heatmap(names: Sequence[str], first_step: int, steps_per_column: int, values: np.ndarray, *, title: str,
                 unit: str, high: float | None = None, highlight: Sequence[str] = ()) -> HeatmapSpec:
    """Ranks as rows, step numbers as x, colour = `values` (ranks × columns, NaN where a rank has no step); the
    scale tops at `high`, by default the 99th percentile, so one slow step does not wash the rest out."""
    v = np.asarray(values, dtype=np.float64)
    finite = v[np.isfinite(v)]
    top = float(high if high is not None else (np.percentile(finite, 99) if finite.size else 1.0)) or 1.0
    return HeatmapSpec(title=title, rows=list(names), x0=float(first_step), dx=float(steps_per_column),
                       values=np.round(v, 3), high=top, unit=unit, highlight=list(highlight),
                       kind="step_heatmap", na="" if v.size else "not applicable: no steps")


def histogram(hists: Sequence[Hist], *, title: str, x_label: str, y_label: str = "count",
              height: int = 260, colors: dict[str, str] | None = None) -> HistogramSpec:
    """Overlaid histograms (one semi-transparent set of bars each); a legend click hides one."""
    series = []
    for h in hists:
        edges = np.asarray(h.edges, dtype=np.float64)
        series.append(HistSeries(h.name, edges[:-1], edges[1:], np.asarray(h.counts, dtype=np.float64)))
    return HistogramSpec(title=title, height=height, series=series, x_label=x_label, y_label=y_label,
                         colors=dict(colors or {}))


def bars(categories: Sequence[str], values: Sequence[float], *, title: str, y_label: str, height: int = 240,
         highlight: set[str] | None = None) -> BarsSpec:
    """One bar per category (a node…); highlighted ones in red."""
    return BarsSpec(title=title, height=height, categories=[str(c) for c in categories],
                    series=[BarSeries(y_label, [float(v) for v in values])], y_label=y_label,
                    highlight=sorted(str(c) for c in (highlight or set())))


def grid(children: Sequence[ChartSpec], *, ncols: int | None = None, share_x: bool = False) -> GridSpec:
    """Several specs side by side (`ncols` per row; all in one row by default), time axes shared on request."""
    kids = list(children)
    return GridSpec(children=kids, ncols=ncols or max(1, len(kids)), share_x=share_x)


def row(*children: ChartSpec) -> GridSpec:
    """Specs side by side (bokeh.layouts.row's place)."""
    return grid(children)
