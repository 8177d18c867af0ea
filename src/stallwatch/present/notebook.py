"""Notebook views of a run, as in the deep-profiling blog post: MetricsHistogram, StepHistogram, Heatmap and
Timeline. Each takes a Run (or a run's path or URI), builds its Bokeh model (`.figure`) at once, and renders
inline when it is the last expression of a Jupyter cell (or on `.show()`); BokehJS is inlined, so it works
offline.

    from stallwatch.notebook import Heatmap, MetricsHistogram, StepHistogram, Timeline
    MetricsHistogram("stallwatch-runs/<run-id>", select_dimensions=["CPU", "GPU"])
    Heatmap(run, select_dimensions=["CPU", "GPU"], select_events=["total", "gpu.*"], plot_height=450)
"""

from __future__ import annotations

import re
from os import PathLike
from typing import Any, Iterable, Sequence

from stallwatch.analyze import heatmap as _heatmap
from stallwatch.analyze import timeline as _timeline
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.findings import Findings
from stallwatch.analyze.histograms import step_duration_histograms, utilization_histograms
from stallwatch.analyze.series import HeatRows, Hist, Marker, Span
from stallwatch.present import charts
from stallwatch.present.report.sections.heatmap import stack
from stallwatch.records import TRAIN
from stallwatch.store.reader import Run

__all__ = ["Heatmap", "MetricsHistogram", "StepHistogram", "Timeline", "findings"]

_notebook_ready = False


RunLike = Run | str | PathLike[str] | RunAnalysis


def _context(run: RunLike) -> RunAnalysis:
    if isinstance(run, RunAnalysis):
        return run
    return RunAnalysis(run if isinstance(run, Run) else str(run))


def findings(run: RunLike) -> Findings:
    """The run's findings, most training time at stake first, with the verdict: the same as the top of the
    report, the terminal summary and findings.json (`.to_json()`)."""
    return _context(run).findings


def _nodes(ctx: RunAnalysis, nodes: Iterable[str] | None) -> list[str]:
    if nodes is None:
        return list(ctx.nodes)
    wanted = [str(n) for n in nodes]
    unknown = [n for n in wanted if n not in ctx.nodes]
    if unknown:
        raise ValueError(f"unknown node(s) {', '.join(unknown)}; the run has {', '.join(ctx.nodes) or 'none'}")
    return wanted


def _selected(device: str, events: Sequence[str] | None) -> bool:
    """`select_events` as in smdebug: regular expressions matched against a device name ("cpu3", "gpu0");
    "total" is the node-wide CPU device."""
    if events is None:
        return True
    name = device.split(" ")[0] if " total" not in device else "total"
    return any(re.fullmatch(p, name) for p in events)


class _View:
    """A built Bokeh model and how to show it."""

    figure: Any = None

    def show(self) -> None:
        """Render the view: inline in Jupyter, otherwise as Bokeh's `show` does (an HTML file in a browser)."""
        from bokeh.io import show

        _enable_notebook()
        show(self.figure)

    def _ipython_display_(self) -> None:
        self.show()


def _enable_notebook() -> None:
    """output_notebook() once per kernel, with BokehJS inlined (no network); nothing outside IPython."""
    global _notebook_ready
    if _notebook_ready:
        return
    try:
        from IPython import get_ipython
    except ImportError:
        return
    if get_ipython() is None:
        return
    from bokeh.io import output_notebook
    from bokeh.resources import INLINE

    output_notebook(resources=INLINE, hide_banner=True)
    _notebook_ready = True


class MetricsHistogram(_View):
    """Histograms of utilization values (bins over 0–100 %), per node and dimension, one overlaid histogram per
    device: good utilization centres at 80–90 %; GPUs of one node whose histograms differ point at an uneven
    workload. Dimensions: "CPU" (each core and the total), "GPU", "GPU memory", "I/O" (wait per core and total);
    `select_events` filters devices by regular expression ("total", "cpu[0-3]", "gpu0")."""

    def __init__(self, run: RunLike,
                 select_dimensions: Sequence[str] = ("CPU", "GPU", "GPU memory", "I/O"),
                 select_events: Sequence[str] | None = None, nodes: Iterable[str] | None = None,
                 bins: int = 50, plot_height: int = 260) -> None:
        from bokeh.layouts import gridplot

        ctx = _context(run)
        self.histograms: dict[tuple[str, str], list[Hist]] = {}
        figures = []
        for node in _nodes(ctx, nodes):
            frame = ctx.system(node, _timeline.METRICS)
            for dim in select_dimensions:
                hists = utilization_histograms(frame, dim, bins=bins,
                                               keep=lambda name: _selected(name, select_events))
                if hists:
                    self.histograms[(node, dim)] = hists
                    figures.append(charts.histogram(hists, title=f"{node}: {dim} utilization", x_label="%",
                                                    y_label="% of samples", height=plot_height))
        if not figures:
            raise ValueError("nothing to show: no recorded metric matches the selected dimensions and events")
        self.figure = figures[0] if len(figures) == 1 else gridplot(figures, ncols=2, sizing_mode="stretch_width")


class StepHistogram(_View):
    """Histogram of step durations (ms), one per node and rank, overlaid: significant outliers point at a
    bottleneck, and clusters of step durations show up as separate peaks."""

    def __init__(self, run: RunLike, mode: str | None = TRAIN,
                 nodes: Iterable[str] | None = None, bins: int = 100, plot_height: int = 320) -> None:
        ctx = _context(run)
        wanted = _nodes(ctx, nodes)
        self.histograms: list[Hist] = step_duration_histograms(ctx.run, mode=mode, nodes=wanted, bins=bins)
        if not self.histograms:
            which = f"{mode} " if mode else ""
            raise ValueError(f"nothing to show: the run recorded no {which}steps on {', '.join(wanted)}")
        title = f"Step duration ({mode} steps)" if mode else "Step duration"
        self.figure = charts.histogram(self.histograms, title=title, x_label="ms", y_label="steps",
                                       height=plot_height)


class Heatmap(_View):
    """Per node, every GPU and CPU core a row, time as x, colour = utilization: GPUs idle while cores are at
    their maximum show a CPU bottleneck. `select_dimensions`: "CPU", "GPU", "GPU memory", "I/O";
    `select_events`: regular expressions on device names ("total" is the node-wide CPU)."""

    def __init__(self, run: RunLike,
                 select_dimensions: Sequence[str] = ("GPU", "CPU"), select_events: Sequence[str] | None = None,
                 nodes: Iterable[str] | None = None, plot_height: int | None = None, buckets: int = 1000) -> None:
        from bokeh.models import DataRange1d

        ctx = _context(run)
        x_range = DataRange1d(range_padding=0)
        figures = []
        self.rows: dict[str, HeatRows] = {}
        for node in _nodes(ctx, nodes):
            frame = ctx.system(node, _timeline.METRICS)
            rows = [r for r in _heatmap.row_columns(frame, tuple(select_dimensions), total=select_events is not None)
                    if _selected(r[0], select_events)]
            heat = _heatmap.heat_rows(frame, buckets, rows=rows)
            if heat is None:
                continue
            self.rows[node] = heat
            figures.append(charts.heatmap(heat, title=f"{node}: utilization", height=plot_height, x_range=x_range))
        if not figures:
            raise ValueError("nothing to show: no recorded device matches the selected dimensions and events")
        self.figure = figures[0] if len(figures) == 1 else stack(figures)


class Timeline(_View):
    """System metrics of every node over the whole job (the report's timeline): CPU, GPU, memory, I/O wait,
    network, one line per node, with the training phases shaded and, with `flags`, the rules' flagged moments
    (evaluated from the data when the run has no stored results)."""

    def __init__(self, run: RunLike, nodes: Iterable[str] | None = None,
                 phases: bool = True, flags: bool = True, plot_height: int = 200) -> None:
        ctx = _context(run)
        self.panels = ctx.timeline_panels(_nodes(ctx, nodes))
        if not self.panels:
            raise ValueError("nothing to show: no node recorded system metrics")
        spans = ctx.phase_spans if phases else []
        marks: list[Marker] = []
        ranges: list[Span] = []
        if flags:
            ranges = ctx.flagged_spans
            marks = ctx.flagged_markers
        self.spans, self.flags, self.markers = spans, ranges, marks
        self.figure = charts.timeline(self.panels, spans=spans, flags=ranges, markers=marks, height=plot_height)
