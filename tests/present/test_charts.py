"""Bokeh figure builders: what they draw from the aggregated data they are handed, and (in Chromium) that
hiding a series in one timeline panel hides it in all of them."""

from __future__ import annotations

import numpy as np
from bokeh.embed import file_html
from bokeh.models import GlyphRenderer, GridPlot, HBar, HoverTool, Image, Legend, Quad, Scatter, VBar, VStrip
from bokeh.resources import INLINE

from stallwatch.analyze.series import HeatRows, Hist, Marker, Panel, Series, Span
from stallwatch.present import charts

T0 = 1_700_000_000_000_000
S = 1_000_000


def _series(name: str, n: int = 100, level: float = 50.0) -> Series:
    ts = T0 + np.arange(n, dtype=np.int64) * S // 2
    return Series(name, ts, np.full(n, level, dtype=np.float32))


def _renderers(fig, glyph):
    return [r for r in fig.renderers if isinstance(r, GlyphRenderer) and isinstance(r.glyph, glyph)]


def _figures(model):
    return [child[0] for child in model.children] if isinstance(model, GridPlot) else [model]


def _two_panels():
    panels = [Panel("CPU", "%", [_series("algo-1"), _series("algo-2", level=20)], percent=True),
              Panel("Network", "MB/s", [_series("algo-1", level=3.0)])]
    spans = [Span(T0, T0 + 10 * S, "Training"), Span(T0 + 20 * S, T0 + 30 * S, "Training"),
             Span(T0 + 12 * S, T0 + 18 * S, "Evaluation", "eval pass")]
    flags = [Span(T0 + 40 * S, T0 + 41 * S, "CPU bottleneck", "on algo-1")]
    markers = [Marker(T0 + 5 * S, "Outlier step", "TRAIN step 9: 2 s")]
    return charts.timeline(panels, spans=spans, flags=flags, markers=markers)


def test_timeline_panels_share_time_axis_and_overlays():
    model = _two_panels()
    track, *figs = _figures(model)
    assert track.title.text == "Flagged by the rules" and len(figs) == 2
    assert figs[0].x_range is figs[1].x_range is track.x_range
    assert all(f.xaxis[0].__class__.__name__ == "DatetimeAxis" for f in figs)
    strips = [_renderers(f, VStrip) for f in figs]
    assert [len(s) for s in strips] == [3, 3]  # one glyph per label (2 phases, 1 flag), not one per span
    assert strips[0][0].data_source is strips[1][0].data_source  # drawn in every panel, stored once
    train = strips[0][0].data_source.data
    assert list(train["x0"]) == [T0 / 1000, (T0 + 20 * S) / 1000] and list(train["x1"])[0] == (T0 + 10 * S) / 1000
    # flags: shaded in the panels and a bar in the track, from the same data
    (bar,) = _renderers(track, HBar)
    assert bar.data_source is strips[0][2].data_source and list(bar.data_source.data["y"]) == ["CPU bottleneck"]
    (points,) = _renderers(track, Scatter)
    assert list(points.data_source.data["text"]) == ["TRAIN step 9: 2 s"]
    assert list(track.y_range.factors) == ["Outlier step", "CPU bottleneck"]
    assert not any(_renderers(f, Scatter) for f in figs)  # outlier marks stay out of the metric panels


def test_timeline_one_legend_per_figure_kind_that_hides():
    track, first, second = _figures(_two_panels())
    legend = first.select_one(Legend)
    assert legend.click_policy == "hide" and legend in first.above
    labels = [item.label.value for item in legend.items]
    assert labels == ["Training", "Evaluation", "CPU bottleneck", "algo-1", "algo-2"]
    assert all(r in first.renderers for item in legend.items for r in item.renderers)
    assert second.select_one(Legend) is None
    assert [item.label.value for item in track.select_one(Legend).items] == ["CPU bottleneck", "Outlier step"]
    line = next(r for r in first.renderers if r.name == "algo-2")
    assert line.data_source.data["y"].dtype == np.float32
    assert line.data_source.data["x"][0] == T0 / 1000
    assert any(isinstance(t, HoverTool) for t in first.tools)
    # the same node keeps its colour in every panel
    colors = {next(r for r in f.renderers if r.name == "algo-1").glyph.line_color for f in (first, second)}
    assert len(colors) == 1
    assert first.y_range.end == 105 and second.y_range.__class__.__name__ == "DataRange1d"


def test_amounts_start_at_zero_and_never_in_scientific_notation():
    """A percent panel is 0–105; an amount (network MB/s, I/O wait) starts at 0 and its ticks read 0.00015,
    not 1.500e-4, on an idle node."""
    cpu, net = (_figures(_two_panels())[i + 1] for i in range(2))  # the first figure is the flagged track
    assert (cpu.y_range.start, cpu.y_range.end) == (0, 105)
    assert net.y_range.start == 0 and net.yaxis[0].formatter.use_scientific is False


def test_single_panel_is_one_figure():
    fig = charts.timeline([Panel("CPU", "%", [_series("n")])])
    assert not isinstance(fig, GridPlot) and fig.title.text == "CPU"


def test_heatmap_one_byte_per_cell_no_data_marked():
    values = np.array([[0.0, 49.6, np.nan, 100.0], [12.2, np.nan, 101.0, -1.0]])
    fig = charts.heatmap(HeatRows(["gpu0", "cpu0"], T0, 60 * S, values), title="algo-1")
    image = _renderers(fig, Image)[0]
    data = image.data_source.data["image"][0]
    assert data.dtype == np.uint8
    assert data.tolist() == [[0, 50, charts.NO_DATA, 100], [12, charts.NO_DATA, 100, 0]]
    assert image.glyph.x == T0 / 1000 and image.glyph.dw == 4 * 60 * 1000 and image.glyph.dh == 2
    assert (fig.y_range.start, fig.y_range.end) == (2, 0)  # row 0 (the first GPU) on top
    assert fig.yaxis.major_label_overrides == {0.5: "gpu0", 1.5: "cpu0"}


def test_heatmap_labels_at_most_about_forty_rows():
    names = [f"cpu{i}" for i in range(192)]
    fig = charts.heatmap(HeatRows(names, T0, S, np.zeros((192, 10))), title="big")
    assert len(fig.yaxis.major_label_overrides) <= 40
    assert fig.height <= 900


def test_histogram_overlays_and_legend():
    edges = np.linspace(0, 100, 11)
    fig = charts.histogram([Hist("gpu0", edges, np.arange(10)), Hist("gpu1", edges, np.ones(10))],
                           title="GPU", x_label="%")
    quads = _renderers(fig, Quad)
    assert [q.name for q in quads] == ["gpu0", "gpu1"]
    assert list(quads[0].data_source.data["left"]) == list(edges[:-1])
    assert list(quads[0].data_source.data["top"]) == list(range(10))
    assert fig.select_one(Legend).click_policy == "hide"
    single = charts.histogram([Hist("only", edges, np.ones(10))], title="t", x_label="%")
    assert single.select_one(Legend) is None


def test_bars_highlight():
    fig = charts.bars(["a", "b", "c"], [1.0, 2.0, 9.0], title="t", y_label="ms", highlight={"c"})
    data = _renderers(fig, VBar)[0].data_source.data
    assert data["color"][2] != data["color"][0] == data["color"][1]


def test_hiding_a_series_hides_it_in_every_panel(tmp_path, browser):
    page_file = tmp_path / "timeline.html"
    page_file.write_text(file_html(_two_panels(), INLINE, "timeline"))
    js = """async () => {
        const doc = Bokeh.documents[0];
        const named = [...doc._all_models.values()].filter(m => m.name === "algo-1");  // one line per panel
        named[0].visible = false;
        await new Promise(resolve => setTimeout(resolve, 200));  // CustomJS callbacks run asynchronously
        return named.map(m => m.visible);
    }"""
    context = browser.new_context()
    try:
        page = context.new_page()
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(page_file.as_uri())
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0")
        visible = page.evaluate(js)
    finally:
        context.close()
    assert visible == [False, False]
    assert errors == []
