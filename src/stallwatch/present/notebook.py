"""Notebook views of a run, as in the deep-profiling blog post: MetricsHistogram, StepHistogram, Heatmap and
Timeline. Each takes a Run (or a run's path or URI), builds its chart spec (`.figure`, the report's kind) at once, and
renders inline when it is the last expression of a Jupyter cell (or on `.show()`), drawn by the report's
draw.js with BokehJS inlined, so it works offline.

    from stallwatch.notebook import Heatmap, MetricsHistogram, StepHistogram, Timeline
    MetricsHistogram("stallwatch-runs/<run-id>", select_dimensions=["CPU", "GPU"])
    Heatmap(run, select_dimensions=["CPU", "GPU"], select_events=["total", "gpu.*"], plot_height=450)
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from os import PathLike
from typing import Any

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
    """A built chart spec and how to show it: the report's page (BokehJS, draw.js, the spec), in an iframe in
    Jupyter, as a file in a browser elsewhere."""

    figure: Any = None

    def html(self) -> str:
        """A self-contained page drawing this view."""
        from stallwatch.present import drawpage

        return (f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">'
                f"{drawpage.chart_div(0)}{drawpage.page_scripts([self.figure.to_json()])}</body></html>")

    def _repr_html_(self) -> str:
        height = _height(self.figure)
        return (f'<iframe style="width:100%;border:0" height="{height}" '
                f'srcdoc="{html.escape(self.html(), quote=True)}"></iframe>')

    def show(self) -> None:
        """Render the view: inline in Jupyter, otherwise a page opened in the browser."""
        try:
            from IPython import get_ipython
            from IPython.display import HTML, display
        except ImportError:
            get_ipython = None  # type: ignore[assignment]
        if get_ipython is not None and get_ipython() is not None:
            display(HTML(self._repr_html_()))
            return
        import tempfile
        import webbrowser

        with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False, encoding="utf-8") as f:
            f.write(self.html())
        webbrowser.open(f"file://{f.name}")


def _height(spec: Any) -> int:
    """About how tall the drawn view is, for its iframe."""
    if isinstance(spec, charts.GridSpec):
        per_row = [max((_height(c) for c in spec.children[i:i + spec.ncols]), default=0)
                   for i in range(0, len(spec.children), spec.ncols)]
        return sum(per_row) + 20
    if isinstance(spec, charts.TimeSpec):
        return sum(p.height or spec.panel_height or 200 for p in spec.panels) + 140
    if isinstance(spec, charts.HeatmapSpec):
        return spec.height or int(min(900, max(160, 60 + 12 * len(spec.rows))))
    return (spec.height or 300) + 20


class MetricsHistogram(_View):
    """Histograms of utilization values (bins over 0–100 %), per node and dimension, one overlaid histogram per
    device: good utilization centres at 80–90 %; GPUs of one node whose histograms differ point at an uneven
    workload. Dimensions: "CPU" (each core and the total), "GPU", "GPU memory", "I/O" (wait per core and total);
    `select_events` filters devices by regular expression ("total", "cpu[0-3]", "gpu0")."""

    def __init__(self, run: RunLike,
                 select_dimensions: Sequence[str] = ("CPU", "GPU", "GPU memory", "I/O"),
                 select_events: Sequence[str] | None = None, nodes: Iterable[str] | None = None,
                 bins: int = 50, plot_height: int = 260) -> None:
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
        self.figure = figures[0] if len(figures) == 1 else charts.grid(figures, ncols=2)


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
        ctx = _context(run)
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
            figures.append(charts.heatmap(heat, title=f"{node}: utilization", height=plot_height))
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
