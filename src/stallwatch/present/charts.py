"""Bokeh figure builders shared by the report and the notebook views: time lines with shaded spans and flags,
the utilization heatmap and histograms. They draw aggregated data handed to them (already downsampled, binned
or bucketed) and compute nothing; timestamps come in as int64 µs and go to Bokeh as epoch milliseconds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from bokeh.layouts import gridplot
from bokeh.models import (
    BasicTickFormatter,
    ColorBar,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    DataRange1d,
    FactorRange,
    FixedTicker,
    HoverTool,
    Legend,
    LegendItem,
    LinearColorMapper,
    Range1d,
)
from bokeh.plotting import figure

from stallwatch import catalogue
from stallwatch.analyze.series import HeatRows, Hist, Marker, Panel, Span

TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
NO_DATA = 255  # heatmap cells without a value (the rest are whole percent, 0-100)
NO_DATA_COLOR = catalogue.NO_DATA_COLOUR
HEAT_PALETTE = list(catalogue.HEAT_PALETTE)  # the dashboard's heatmaps use the same
_EXTRA = catalogue.SERIES_PALETTE[::-1]  # spans or marks the catalogue does not name (none today)


@dataclass
class Overlay:
    """Shaded spans, flagged ranges and markers as data sources shared by every figure of a timeline (stored
    once), and the renderers drawn from each label (hidden together)."""
    spans: dict[str, ColumnDataSource] = field(default_factory=dict)
    flags: dict[str, ColumnDataSource] = field(default_factory=dict)
    markers: dict[str, ColumnDataSource] = field(default_factory=dict)
    drawn: dict[str, list[Any]] = field(default_factory=dict)
    extra_colors: list[str] = field(default_factory=list)

    def color(self, label: str) -> str:
        return _color(label, self.extra_colors)


def ms(ts_us: np.ndarray | int | Sequence[int]) -> Any:
    """µs since the epoch -> Bokeh's datetime unit (ms, float64)."""
    return np.asarray(ts_us, dtype=np.int64) / 1000.0


def palette(n: int) -> list[str]:
    """Colours for `n` lines that are no phase (nodes, devices), in order: the catalogue's series palette."""
    return [catalogue.SERIES_PALETTE[i % len(catalogue.SERIES_PALETTE)] for i in range(n)]


def _color(label: str, seen: list[str]) -> str:
    """A span's, flag's or marker's colour: the catalogue's for its phase or flag, else one of a few spares."""
    known = catalogue.colour(label)
    if known is not None:
        return known
    if label not in seen:
        seen.append(label)
    return _EXTRA[seen.index(label) % len(_EXTRA)]


def _span_sources(spans: Sequence[Span]) -> dict[str, ColumnDataSource]:
    out = {}
    for label in dict.fromkeys(s.label for s in spans):
        mine = [s for s in spans if s.label == label]
        out[label] = ColumnDataSource({"x0": ms([s.start_us for s in mine]), "x1": ms([s.end_us for s in mine]),
                                       "y": [label] * len(mine), "text": [s.text or label for s in mine]})
    return out


def overlay(spans: Sequence[Span] = (), flags: Sequence[Span] = (), markers: Sequence[Marker] = ()) -> Overlay:
    """Group spans, flagged ranges and markers by label into one column data source each."""
    out = Overlay(spans=_span_sources(spans), flags=_span_sources(flags))
    for label in dict.fromkeys(m.label for m in markers):
        mine = [m for m in markers if m.label == label]
        out.markers[label] = ColumnDataSource({"x": ms([m.at_us for m in mine]), "y": [label] * len(mine),
                                               "text": [m.text or label for m in mine]})
    return out


def timeline(panels: Sequence[Panel], *, spans: Sequence[Span] = (), flags: Sequence[Span] = (),
             markers: Sequence[Marker] = (), height: int = 200, colors: dict[str, str] | None = None) -> Any:
    """Stacked time-line figures sharing one zoomable datetime x axis. `spans` (training phases) are shaded
    in every panel; `flags` (flagged ranges: bottlenecks) are shaded too and drawn as bars in a "Flagged" track
    on top, where `markers` (flagged moments: outlier steps) are points. One legend, above, lists every line,
    span and flag group; a click hides it in every panel."""
    shared = overlay(spans, flags, markers)
    x_range = DataRange1d(range_padding=0.01)
    names = list(dict.fromkeys(s.name for p in panels for s in p.series))
    colors = {**catalogue.colours(names), **(colors or {})}
    figures = [_panel(p, shared, x_range, height, colors) for p in panels]
    _legend(figures[0], [*shared.spans, *shared.flags, *names], shared)
    if shared.flags or shared.markers:
        track = _track(shared, x_range)
        _legend(track, [*shared.flags, *shared.markers], shared)
        figures.insert(0, track)
    for f in figures[:-1]:
        f.xaxis.major_label_text_font_size = "0pt"  # one set of dates, under the last figure
    _share_time_axis(figures)
    _link_visibility(shared.drawn)
    if len(figures) == 1:
        return figures[0]
    return gridplot([[f] for f in figures], merge_tools=True, toolbar_location="right", sizing_mode="stretch_width")


def _share_time_axis(figures: list[Any]) -> None:
    """One datetime ticker and formatter for every panel of a timeline, not one each: a datetime axis is about
    twenty Bokeh models (a ticker per time scale), and serializing models is most of what a report costs."""
    ticker, formatter = figures[-1].xaxis[0].ticker, figures[-1].xaxis[0].formatter
    for f in figures[:-1]:
        f.xaxis[0].ticker = ticker
        f.xaxis[0].formatter = formatter
        f.xgrid[0].ticker = ticker


def _legend(fig: Any, labels: list[str], shared: Overlay) -> None:
    """A horizontal legend above `fig`, wrapping into rows, of the labels it draws; a click hides the label's
    renderers in this figure, and `_link_visibility` hides them in the others."""
    mine = set(fig.renderers)
    items = [LegendItem(label=label, renderers=[r for r in shared.drawn.get(label, []) if r in mine])
             for label in dict.fromkeys(labels)]
    items = [item for item in items if item.renderers]
    if not items:
        return
    cols = min(len(items), 8)
    fig.add_layout(Legend(items=items, click_policy="hide", orientation="horizontal", ncols=cols,
                          label_text_font_size="8pt", spacing=8, padding=2, margin=0), "above")
    fig.height += 22 * -(-len(items) // cols)


def _link_visibility(drawn: dict[str, list[Any]]) -> None:
    """The legend's entry holds one of each label's renderers per figure; hiding one hides them all (also when
    set from outside the legend)."""
    for renderers in drawn.values():
        if len(renderers) > 1:
            sync = CustomJS(args={"rs": renderers},
                            code="for (const r of rs) { if (r.visible != cb_obj.visible) r.visible = cb_obj.visible }")
            for r in renderers:
                r.js_on_change("visible", sync)


def _track(shared: Overlay, x_range: Any) -> Any:
    """The "Flagged" track: a row per flag label, ranges as bars and moments as markers, with hover texts."""
    rows = list(dict.fromkeys([*shared.flags, *shared.markers]))
    f = figure(title="Flagged by the rules", x_axis_type="datetime", x_range=x_range, y_range=FactorRange(*rows[::-1]),
               height=50 + 24 * len(rows), tools=TOOLS, active_scroll="xwheel_zoom", sizing_mode="stretch_width")
    bars, points = [], []
    for label, source in shared.flags.items():
        r = f.hbar(y="y", left="x0", right="x1", height=0.6, source=source, color=shared.color(label), alpha=0.8)
        shared.drawn.setdefault(label, []).append(r)
        bars.append(r)
    for label, source in shared.markers.items():
        r = f.scatter(x="x", y="y", source=source, marker="inverted_triangle", size=8, color=shared.color(label),
                      alpha=0.8)
        shared.drawn.setdefault(label, []).append(r)
        points.append(r)
    if bars:
        f.add_tools(HoverTool(renderers=bars, tooltips=[("", "@text"), ("from", "@x0{%F %T}"), ("to", "@x1{%F %T}")],
                              formatters={"@x0": "datetime", "@x1": "datetime"}))
    if points:
        f.add_tools(HoverTool(renderers=points, tooltips=[("", "@text"), ("time", "@x{%F %T}")],
                              formatters={"@x": "datetime"}))
    f.ygrid.visible = False
    f.toolbar.logo = None
    return f


def _panel(panel: Panel, shared: Overlay, x_range: Any, height: int, colors: dict[str, str]) -> Any:
    f = figure(title=panel.title, x_axis_type="datetime", x_range=x_range, height=height, tools=TOOLS,
               active_scroll="xwheel_zoom", sizing_mode="stretch_width", y_axis_label=panel.y_label)
    if panel.percent:
        f.y_range = Range1d(0, 105, bounds=(0, 105))
    else:  # never negative (I/O wait, network); an idle node's network reads 0.00015 MB/s, not 1.500e-4
        f.y_range.start = 0
        f.yaxis.formatter = BasicTickFormatter(use_scientific=False)
    for label, source in [*shared.spans.items(), *shared.flags.items()]:
        r = f.vstrip(x0="x0", x1="x1", source=source, fill_color=shared.color(label), fill_alpha=0.15, line_alpha=0)
        shared.drawn.setdefault(label, []).append(r)
    lines = []
    for s in panel.series:
        source = ColumnDataSource({"x": ms(s.ts), "y": np.asarray(s.values, dtype=np.float32)})
        r = f.line(x="x", y="y", source=source, color=colors[s.name], line_width=1.3, name=s.name)
        lines.append(r)
        shared.drawn.setdefault(s.name, []).append(r)
    f.add_tools(HoverTool(renderers=lines, tooltips=[("", "$name"), ("time", "@x{%F %T}"),
                                                     ("value", f"@y{{{panel.y_format}}}")],
                          formatters={"@x": "datetime"}))
    f.toolbar.logo = None
    return f


def heatmap(rows: HeatRows, *, title: str, height: int | None = None, x_range: Any = None) -> Any:
    """Every row (a GPU, a core) a band, time as x, colour = utilization (%): one image glyph, stored as whole
    percent in one byte per cell; cells without data are grey."""
    n_rows, n_cols = rows.values.shape
    cells = np.where(np.isnan(rows.values), NO_DATA, np.clip(np.rint(np.nan_to_num(rows.values)), 0, 100))
    image = cells.astype(np.uint8)
    height = height or int(min(900, max(160, 60 + 12 * n_rows)))
    f = figure(title=title, x_axis_type="datetime", height=height, tools=TOOLS, active_scroll="xwheel_zoom",
               sizing_mode="stretch_width", y_range=Range1d(n_rows, 0, bounds=(0, n_rows)),
               x_range=x_range if x_range is not None else DataRange1d(range_padding=0))
    mapper = LinearColorMapper(palette=HEAT_PALETTE, low=0, high=100, high_color=NO_DATA_COLOR)
    x0 = float(ms(rows.start_us))
    f.image(image=[image], x=x0, y=0, dw=n_cols * rows.width_us / 1000.0, dh=n_rows, color_mapper=mapper,
            anchor="bottom_left", origin="bottom_left")
    step = max(1, int(np.ceil(n_rows / 40)))  # at most ~40 labels; hover names every row
    ticks = list(range(0, n_rows, step))
    f.yaxis.ticker = FixedTicker(ticks=[t + 0.5 for t in ticks])
    f.yaxis.major_label_overrides = {t + 0.5: rows.names[t] for t in ticks}
    f.ygrid.visible = False
    row_name = CustomJSHover(args={"names": list(rows.names)},
                             code="const i = Math.floor(value); return i >= 0 && i < names.length ? names[i] : ''")
    cell = CustomJSHover(code=f"return value == {NO_DATA} ? 'no data' : value + ' %'")
    f.add_tools(HoverTool(tooltips=[("", "$y{row}"), ("time", "$x{%F %T}"), ("mean", "@image{cell}")],
                          formatters={"$y": row_name, "$x": "datetime", "@image": cell}))
    f.add_layout(ColorBar(color_mapper=mapper, width=10, title="%"), "right")
    f.toolbar.logo = None
    return f


def step_heatmap(names: Sequence[str], first_step: int, steps_per_column: int, values: np.ndarray, *, title: str,
                 unit: str, high: float | None = None, highlight: Sequence[str] = ()) -> Any:
    """Ranks as rows, step numbers as x, colour = `values` (ranks × columns, NaN where a rank has no step):
    one image glyph of one byte per cell (254 levels from 0 to `high`, which defaults to the 99th percentile
    so one slow step does not wash the rest out); rows named in `highlight` are marked on the axis."""
    finite = values[np.isfinite(values)]
    top = float(high if high is not None else (np.percentile(finite, 99) if finite.size else 1.0)) or 1.0
    levels = np.where(np.isnan(values), NO_DATA, np.clip(np.rint(254.0 * np.nan_to_num(values) / top), 0, 254))
    n_rows, n_cols = values.shape
    height = int(min(900, max(160, 60 + 14 * n_rows)))
    f = figure(title=title, height=height, tools=TOOLS, active_scroll="xwheel_zoom", sizing_mode="stretch_width",
               y_range=Range1d(n_rows, 0, bounds=(0, n_rows)), x_axis_label="step",
               x_range=DataRange1d(range_padding=0))
    mapper = LinearColorMapper(palette=HEAT_PALETTE, low=0, high=254, high_color=NO_DATA_COLOR)
    f.image(image=[levels.astype(np.uint8)], x=first_step, y=0, dw=n_cols * steps_per_column, dh=n_rows,
            color_mapper=mapper, anchor="bottom_left", origin="bottom_left")
    step = max(1, int(np.ceil(n_rows / 40)))
    ticks = list(range(0, n_rows, step))
    marked = set(highlight)
    f.yaxis.ticker = FixedTicker(ticks=[t + 0.5 for t in ticks])
    f.yaxis.major_label_overrides = {t + 0.5: (f"▶ {names[t]}" if names[t] in marked else names[t]) for t in ticks}
    f.ygrid.visible = False
    row_name = CustomJSHover(args={"names": list(names)},
                             code="const i = Math.floor(value); return i >= 0 && i < names.length ? names[i] : ''")
    cell = CustomJSHover(args={"top": top, "unit": unit},
                         code=f"return value == {NO_DATA} ? 'no step' : '≈ ' + "
                              "Number((value * top / 254).toPrecision(3)).toLocaleString('en-US') "
                              "+ ' ' + unit")
    f.add_tools(HoverTool(tooltips=[("", "$y{row}"), ("step", "$x{0,0}"), ("mean", "@image{cell}")],
                          formatters={"$y": row_name, "@image": cell}))
    bar_mapper = LinearColorMapper(palette=HEAT_PALETTE, low=0, high=top)
    f.add_layout(ColorBar(color_mapper=bar_mapper, width=10, title=unit), "right")
    f.toolbar.logo = None
    return f


def histogram(hists: Sequence[Hist], *, title: str, x_label: str, y_label: str = "count",
              height: int = 260, colors: dict[str, str] | None = None) -> Any:
    """Overlaid histograms (one semi-transparent set of bars each); a legend click hides one."""
    f = figure(title=title, height=height, tools="pan,wheel_zoom,box_zoom,reset,save", sizing_mode="stretch_width",
               x_axis_label=x_label, y_axis_label=y_label)
    names = [h.name for h in hists]
    colors = {**catalogue.colours(names), **(colors or {})}
    items, bars = [], []
    for h in hists:
        edges = np.asarray(h.edges, dtype=np.float64)
        source = ColumnDataSource({"left": edges[:-1], "right": edges[1:],
                                   "top": np.asarray(h.counts, dtype=np.float64)})
        r = f.quad(left="left", right="right", top="top", bottom=0, source=source, fill_color=colors[h.name],
                   fill_alpha=0.45, line_color=colors[h.name], line_alpha=0.8, name=h.name)
        bars.append(r)
        items.append(LegendItem(label=h.name, renderers=[r]))
    f.add_tools(HoverTool(renderers=bars, tooltips=[("", "$name"), ("bin", "@left{0.[000]} – @right{0.[000]}"),
                                                    (y_label, "@top{0.[00]}")]))
    if len(items) > 1:
        f.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="8pt"), "right")
    f.y_range.start = 0
    f.toolbar.logo = None
    return f


def bars(categories: Sequence[str], values: Sequence[float], *, title: str, y_label: str, height: int = 240,
         highlight: set[str] | None = None) -> Any:
    """One bar per category (a node…); highlighted ones in red."""
    highlight = highlight or set()
    source = ColumnDataSource({"x": list(categories), "top": [float(v) for v in values],
                               "color": [catalogue.HIGHLIGHT_COLOUR if c in highlight else catalogue.PLAIN_COLOUR
                                         for c in categories]})
    f = figure(title=title, x_range=list(categories), height=height, tools="save", sizing_mode="stretch_width",
               y_axis_label=y_label)
    f.vbar(x="x", top="top", width=0.7, color="color", source=source)
    f.add_tools(HoverTool(tooltips=[("", "@x"), (y_label, "@top{0.[00]}")]))
    f.y_range.start = 0
    f.xaxis.major_label_orientation = 0.6 if len(categories) > 6 else 0
    f.toolbar.logo = None
    return f
