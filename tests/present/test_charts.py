"""Chart specs (present/charts.py) and draw.js, which draws them with BokehJS: what the specs carry from the
aggregated data they are handed, and in Chromium that every kind draws, a legend click hides a series in every
timeline panel, update() keeps the zoom, linked time axes move together, and names stay text."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from stallwatch import catalogue
from stallwatch.analyze.series import HeatRows, Hist, Marker, Panel, Series, Span
from stallwatch.present import charts, drawpage
from stallwatch.present.report.breakdowns import device_bars, pie

T0 = 1_700_000_000_000_000
S = 1_000_000
IMG = "<img src=x onerror=alert(1)>"


def _series(name: str, n: int = 100, level: float = 50.0) -> Series:
    ts = T0 + np.arange(n, dtype=np.int64) * S // 2
    return Series(name, ts, np.full(n, level, dtype=np.float32))


def _two_panels() -> charts.TimeSpec:
    panels = [Panel("CPU", "%", [_series("algo-1"), _series("algo-2", level=20)], percent=True),
              Panel("Network", "MB/s", [_series("algo-1", level=3.0)])]
    spans = [Span(T0, T0 + 10 * S, "Training"), Span(T0 + 20 * S, T0 + 30 * S, "Training"),
             Span(T0 + 12 * S, T0 + 18 * S, "Evaluation", "eval pass")]
    flags = [Span(T0 + 40 * S, T0 + 41 * S, "CPU bottleneck", "on algo-1")]
    markers = [Marker(T0 + 5 * S, "Outlier step", "TRAIN step 9: 2 s")]
    return charts.timeline(panels, spans=spans, flags=flags, markers=markers)


def test_timeline_spec_groups_overlays_by_label_in_epoch_ms():
    spec = _two_panels().to_json()
    assert spec["kind"] == "time" and [p["title"] for p in spec["panels"]] == ["CPU", "Network"]
    assert spec["panels"][0]["percent"] is True and spec["panels"][1]["percent"] is False
    train, evaluation = spec["spans"]  # one entry per label, not one per span: drawn in every panel, stored once
    assert train["label"] == "Training" and train["x0"] == [T0 / 1000, (T0 + 20 * S) / 1000]
    assert evaluation["text"] == ["eval pass"]
    assert spec["flags"][0]["label"] == "CPU bottleneck" and spec["markers"][0]["text"] == ["TRAIN step 9: 2 s"]
    line = spec["panels"][0]["lines"][1]
    assert line["name"] == "algo-2" and line["x"][0] == T0 / 1000 and line["y"][0] == 20.0


def test_heatmap_spec_gaps_and_evenly_spaced_snapshots():
    values = np.array([[0.0, 49.6, np.nan, 100.0], [12.2, np.nan, 101.0, -1.0]])
    spec = charts.heatmap(HeatRows(["gpu0", "cpu0"], T0, 60 * S, values), title="algo-1").to_json()
    assert spec["rows"] == ["gpu0", "cpu0"] and spec["x0"] == T0 / 1000 and spec["dx"] == 60_000
    assert spec["values"] == [[0.0, 49.6, None, 100.0], [12.2, None, 100.0, 0.0]]  # a gap is null, not grey
    # a snapshot every 3rd column (sampling slower than the buckets): those columns only, 3 wide, no stripes
    sparse = np.full((1, 9), np.nan)
    sparse[0, 1::3] = [10, 20, 30]
    spec = charts.heatmap(HeatRows(["cpu0"], T0, S, sparse), title="slow").to_json()
    assert spec["values"] == [[10.0, 20.0, 30.0]] and spec["dx"] == 3000 and spec["x0"] == (T0 + S) / 1000


def test_pie_and_bars_specs():
    p = pie({"Training loop": 5.0, "Initialization": 2.0, "x": 0.0, "y": float("nan")}, title="t", unit="s",
            top=1)
    assert [(s.label, s.value) for s in p.slices] == [("Training loop", 5.0), ("others", 2.0)]
    assert p.slices[1].color == catalogue.OTHERS_COLOUR
    b = charts.bars(["a", "b", "c"], [1.0, 2.0, 9.0], title="t", y_label="ms", highlight={"c"}).to_json()
    assert b["categories"] == ["a", "b", "c"] and b["series"][0]["values"] == [1.0, 2.0, 9.0]
    assert b["highlight"] == ["c"]
    d = device_bars(["cpu0"], [{"p50": 50.0, "p95": 90.0, "max": 99.0}], title="t").to_json()
    assert [s["name"] for s in d["points"]] == ["p95", "max"] and d["tips"]["min"] == [None]  # NaN -> null


def test_histogram_spec():
    edges = np.linspace(0, 100, 11)
    spec = charts.histogram([Hist("gpu0", edges, np.arange(10)), Hist("gpu1", edges, np.ones(10))],
                            title="GPU", x_label="%").to_json()
    assert [s["name"] for s in spec["series"]] == ["gpu0", "gpu1"]
    assert spec["series"][0]["left"] == list(edges[:-1]) and spec["series"][0]["top"] == list(range(10))


def _page(tmp_path, specs: list[charts.ChartSpec]) -> str:
    body = "".join(drawpage.chart_div(i) for i in range(len(specs)))
    path = tmp_path / "charts.html"
    path.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="width:1200px">{body}'
                    f"{drawpage.page_scripts([s.to_json() for s in specs])}</body></html>", encoding="utf-8")
    return path.as_uri()


@pytest.fixture
def opened(browser: Any, tmp_path):
    """open(specs) -> (page, errors): the specs drawn by draw.js in Chromium, once every chart is drawn."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    errors: list[str] = []

    def open_(specs: list[charts.ChartSpec]) -> Any:
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: (errors.append(f"dialog {d.message}"), d.dismiss()))
        page.goto(_page(tmp_path, specs))
        page.wait_for_function("() => [...document.querySelectorAll('[data-chart]')].every(e => e.dataset.points)")
        page.wait_for_timeout(800)
        return page, errors

    yield open_
    context.close()


def test_every_kind_draws_with_its_points_and_phase_colours(opened):
    box = charts.BoxSpec(title="box", categories=["gpu0"], lower=[1.0], p25=[10.0], p50=[30.0], p75=[50.0],
                         upper=[90.0])
    specs = [_two_panels(),
             charts.heatmap(HeatRows(["gpu0"], T0, S, np.array([[1.0, np.nan, 3.0]])), title="heat"),
             charts.step_heatmap(["r0", "r1"], 10, 2, np.ones((2, 5)), title="steps", unit="ms", highlight=["r1"]),
             charts.histogram([Hist("gpu0", np.linspace(0, 100, 11), np.arange(10))], title="h", x_label="%"),
             charts.bars(["a", "b"], [1.0, 2.0], title="bars", y_label="ms"),
             pie({"Training loop": 5.0, "Initialization": 2.0, IMG: 1.0}, title="pie", unit="s"),
             pie({"Training loop": 5.0}, title="one", unit="s"), box,
             charts.row(pie({"forward": 5.0, "backward": 3.0}), pie({"TRAIN": 5.0, "EVAL": 1.0})),
             charts.timeline([])]
    page, errors = opened(specs)
    els = page.locator("[data-chart]")
    points = [int(els.nth(i).get_attribute("data-points")) for i in range(len(specs))]
    assert points == [302, 2, 10, 10, 2, 3, 0, 1, 4, 0]  # 3 lines x 100 + 1 flag + 1 marker; the gap: not drawn
    for i in (0, 1, 2, 3, 4, 5, 7, 8):
        assert els.nth(i).locator("canvas").count() > 0, i
    assert els.nth(6).inner_text() == "one: all of it Training loop (5 s)."  # one slice: a sentence, not a pie
    assert els.nth(9).inner_text().startswith("not applicable:")
    drawn: dict[str, str] = {}
    for i in range(len(specs)):
        drawn.update(json.loads(els.nth(i).get_attribute("data-series")))
    assert drawn["Outlier step"] not in (drawn["algo-1"], drawn["algo-2"])  # an overlay never takes a line's colour
    for phase in ("Training", "Evaluation", "Training loop", "Initialization", "forward", "backward", "TRAIN",
                  "EVAL", "CPU bottleneck"):
        assert drawn[phase].lower() == catalogue.colour(phase).lower(), phase  # the catalogue's, resolved in JS
    assert page.locator("img").count() == 0 and errors == []


def test_hiding_a_series_hides_it_in_every_panel_and_update_keeps_the_zoom(opened):
    page, errors = opened([_two_panels()])
    result = page.evaluate("""async () => {
        const el = document.querySelector("[data-chart]");
        const doc = JSON.parse(document.getElementById("stallwatch-charts").textContent);
        Draw.setCatalogue(doc.catalogue);
        const handle = Draw.render(el, doc.charts[0]);
        await handle.ready;
        const lines = [...handle.sources.entries()].filter(([k]) => k.startsWith("line:"));
        const renderers = [...handle.view.model.document.all_models].filter(m => m.glyph && m.data_source
            && m.data_source.data.name && m.data_source.data.name[0] === "algo-1");
        const uniq = [...new Set(renderers)];
        uniq[0].visible = false;
        await new Promise(r => setTimeout(r, 100));
        const hidden = uniq.map(r => r.visible);
        handle.xRange.setv({start: handle.xRange.start + 1000, end: handle.xRange.end - 1000});
        const zoom = [handle.xRange.start, handle.xRange.end];
        const spec = JSON.parse(JSON.stringify(doc.charts[0]));
        spec.panels[0].lines[0].y = spec.panels[0].lines[0].y.map(v => v + 1);
        handle.update(spec);
        const src = handle.sources.get(lines[0][0]);
        return {hidden, n: uniq.length, zoom, after: [handle.xRange.start, handle.xRange.end], y: src.data.y[0],
                same: src === lines[0][1]};
    }""")
    assert result["n"] == 2 and result["hidden"] == [False, False]  # algo-1 in both panels, hidden in both
    assert result["same"] and result["y"] == 51.0  # new data in place, the same source
    assert result["after"] == result["zoom"]  # the user's zoom kept
    assert errors == []


def test_linked_time_axes_move_together_and_settle_once(opened):
    a, b = _two_panels(), charts.heatmap(HeatRows(["cpu0"], T0, S, np.ones((1, 50))), title="heat")
    page, errors = opened([a, b])
    result = page.evaluate("""async () => {
        const doc = JSON.parse(document.getElementById("stallwatch-charts").textContent);
        const els = [...document.querySelectorAll("[data-chart]")];
        const hs = els.map((el, i) => Draw.render(el, doc.charts[i]));
        await Promise.all(hs.map(h => h.ready));
        const settled = [];
        Draw.linkX(hs, (x0, x1) => settled.push([x0, x1]));
        for (let i = 0; i < 5; i++) hs[0].xRange.setv({start: 1.7e12 + 1000 * i, end: 1.7e12 + 20000});
        await new Promise(r => setTimeout(r, 600));
        return {other: [hs[1].xRange.start, hs[1].xRange.end], settled};
    }""")
    assert result["other"] == [1.7e12 + 4000, 1.7e12 + 20000]
    assert result["settled"] == [[1.7e12 + 4000, 1.7e12 + 20000]]  # debounced: once, after the moves
    assert errors == []


def test_a_brush_selects_an_interval(opened):
    spec = _two_panels()
    spec.brush = True
    page, errors = opened([spec])
    page.evaluate("""async () => {
        const doc = JSON.parse(document.getElementById("stallwatch-charts").textContent);
        const el = document.querySelector("[data-chart]");
        window.brushed = [];
        Draw.onBrush(el, (x0, x1) => window.brushed.push([x0, x1]));
        await Draw.render(el, doc.charts[0]).ready;
    }""")
    page.wait_for_timeout(300)
    box = page.locator("[data-chart] canvas").nth(1).bounding_box()  # the CPU panel, under the flagged track
    assert box is not None
    page.mouse.move(box["x"] + 300, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + 600, box["y"] + box["height"] / 2 + 10, steps=5)
    page.mouse.up()
    page.wait_for_timeout(300)
    ((x0, x1),) = page.evaluate("window.brushed")
    assert T0 / 1000 < x0 < x1 < (T0 + 50 * S) / 1000  # an interval inside the data, in epoch ms
    assert errors == []


def test_phase_tracks_one_row_per_rank_coloured_by_phase(opened):
    ms = T0 / 1000
    spec = charts.TimeSpec(title="phases", tracks=[
        charts.Track("rank 0", np.array([ms, ms + 10, ms + 30]), np.array([ms + 10, ms + 30, ms + 35]),
                     ["forward", "backward", "optimizer step"]),
        charts.Track("rank 1", np.array([ms, ms + 12]), np.array([ms + 12, ms + 33]), ["forward", "backward"])])
    page, errors = opened([spec])
    el = page.locator("[data-chart]")
    assert el.get_attribute("data-points") == "5" and el.locator("canvas").count() > 0
    series = json.loads(el.get_attribute("data-series"))
    assert series == {p: catalogue.colour(p) for p in ("forward", "backward", "optimizer step")}
    assert errors == []


def test_a_chart_that_fails_to_draw_is_one_line_and_the_others_draw(opened):
    broken = charts.ChartSpec(title="broken", kind="no-such-kind")
    page, errors = opened([charts.bars(["a"], [1.0], title="one", y_label="ms"), broken,
                           charts.bars(["b"], [2.0], title="three", y_label="ms")])
    els = page.locator("[data-chart]")
    assert els.nth(0).locator("canvas").count() > 0 and els.nth(2).locator("canvas").count() > 0
    assert els.nth(1).inner_text() == "This chart could not be drawn (Error)."
    assert errors == []  # said in the page (and a console warning), never an uncaught error


def test_a_new_series_redraws_and_keeps_the_users_zoom(opened):
    page, errors = opened([charts.timeline([Panel("CPU", "%", [_series("algo-1")], percent=True)])])
    page.evaluate("""async () => {
        const doc = JSON.parse(document.getElementById("stallwatch-charts").textContent);
        window.doc = doc;
        window.h = Draw.render(document.querySelector("[data-chart]"), doc.charts[0]);
        await window.h.ready;
    }""")
    page.wait_for_timeout(300)
    box = page.locator("[data-chart] canvas").first.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, -400)  # the user zooms in
    page.wait_for_timeout(400)
    zoomed = page.evaluate("[h.xRange.start, h.xRange.end]")
    after = page.evaluate("""async () => {
        const spec = JSON.parse(JSON.stringify(doc.charts[0]));
        spec.panels[0].lines.push({...spec.panels[0].lines[0], name: "algo-2"});  // a node joins: a new series
        h.update(spec);
        await h.ready;
        await new Promise(r => setTimeout(r, 300));
        return {range: [h.xRange.start, h.xRange.end], series: JSON.parse(h.el.dataset.series)};
    }""")
    assert zoomed[1] - zoomed[0] < 49_000  # zoomed in from 50 s of data
    assert after["range"] == pytest.approx(zoomed) and set(after["series"]) == {"algo-1", "algo-2"}
    assert errors == []
