"""The report as a user sees it: generated runs -> build_report -> the file opened in headless Chromium. No
errors, every section heading shown, every chart drawn, nothing requested from the network, names shown as
text; a full-page screenshot of each is kept in test-artifacts/."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.report import build_report, build_sections
from stallwatch.store.reader import open_run

from ._full_runs import IMG, SCRIPT, Planted, full_run
from .conftest import OpenedReport

MY_SECTIONS = ("summary", "system-usage", "framework", "cpu-operators", "gpu-operators", "rules")


def _titles(root: Path) -> list[tuple[str, str]]:
    """(id, title) of every section the report holds, as the sections build them."""
    return [(s.id, s.title) for s in build_sections(RunAnalysis(open_run(str(root))))]


def _check(opened: OpenedReport, root: Path) -> None:
    """What every report must pass in the browser."""
    assert opened.errors == []
    assert opened.refused == [], "the report asked the network for something"
    assert opened.requests == [Path(root / "report.html").resolve().as_uri()]  # the file itself, nothing more
    assert opened.dialogs == []
    page = opened.page
    for sid, title in _titles(root):
        heading = page.locator(f"section[id='{sid}'] > h2, section[id='{sid}'] > h3")
        assert heading.count() == 1 and heading.inner_text() == title, sid
        assert heading.is_visible(), sid
        assert page.locator(f"nav a[href='#{sid}']").count() == 1, f"{sid} missing from the contents"
    for sid in MY_SECTIONS:
        assert page.locator(f"section[id='{sid}']").count() == 1, sid
    roots = opened.roots()
    assert roots > 0 and opened.drawn_roots() == roots, f"{opened.drawn_roots()} of {roots} charts drawn"
    assert opened.canvases() >= roots


def _tooltips(page) -> list[str]:
    """The texts of the Bokeh tooltips shown now (hidden ones keep their last text)."""
    return [" | ".join(t.locator(".bk-tooltip-row-value span[data-value]").all_inner_texts())
            for t in page.locator(".bk-Tooltip").all() if t.is_visible()]


def test_a_full_report_renders_in_chromium(two_node_run: Planted, open_report):
    path = build_report(str(two_node_run.root))
    opened = open_report(Path(path))
    shot = opened.screenshot("report-two-nodes")
    _check(opened, two_node_run.root)
    page = opened.page
    # my sections drew their charts: the summary's pie, per-device bars, the framework's pies, operator pies
    for sid in ("summary", "system-usage", "framework", "cpu-operators", "gpu-operators"):
        charts = page.locator(f"section[id='{sid}'] div[data-chart]")
        assert charts.count() > 0 and all(charts.nth(i).locator("canvas").count() for i in range(charts.count())), sid
    assert page.locator("section[id='rules'] .verdict.warn").count() >= 2  # CPUBottleneck and StepOutlier fired
    rules_text = page.locator("section[id='rules']").inner_text()
    assert "the CPUBottleneck rule was the most frequently triggered" in rules_text
    assert shot.stat().st_size > 50_000


def test_the_charts_answer_the_mouse(two_node_run: Planted, open_report):
    """Hover shows a wedge's values; clicking a legend entry hides its wedge (the pixels under it change)."""
    opened = open_report(Path(build_report(str(two_node_run.root))))
    page = opened.page
    canvas = page.locator("section[id='summary'] div[data-chart] canvas").first
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    assert box is not None
    # the largest wedge (the training loop, 58 %) starts at twelve o'clock and runs clockwise past three
    page.mouse.move(box["x"] + 125 + 60, box["y"] + 150, steps=4)
    page.wait_for_timeout(300)
    assert any("Training loop" in t for t in _tooltips(page))
    page.mouse.move(5, 5)  # off the chart: no tooltip
    page.wait_for_timeout(300)
    # the pie and its legend, without the canvas's focus ring and the toolbar (both change on any click)
    drawing = {"x": box["x"] + 4, "y": box["y"] + 4, "width": box["width"] - 8, "height": box["height"] - 45}
    before = page.screenshot(clip=drawing)
    for y in range(24, 90, 6):  # down the legend, right of the pie, until its first entry is hit
        page.mouse.click(box["x"] + 290, box["y"] + y)
        page.mouse.move(5, 5)
        page.wait_for_timeout(200)
        if page.screenshot(clip=drawing) != before:
            break
    else:
        pytest.fail("no legend entry answered a click")
    page.mouse.move(box["x"] + 125 + 60, box["y"] + 150, steps=4)  # the hidden wedge answers no more
    page.wait_for_timeout(300)
    assert not any("Training loop" in t for t in _tooltips(page))


def test_names_are_shown_as_text_never_run(hostile_run: Planted, open_report):
    opened = open_report(Path(build_report(str(hostile_run.root))))
    opened.screenshot("report-hostile-names")
    _check(opened, hostile_run.root)
    page = opened.page
    assert page.locator("img").count() == 0  # the node name's <img> was never made an element
    assert page.locator("section script").count() == 0
    assert page.get_by_role("cell", name=SCRIPT, exact=True).count() >= 1  # the operator, in its table
    assert page.get_by_role("cell", name=IMG, exact=True).count() >= 2  # the node, in the usage tables
    assert SCRIPT in page.locator("section[id='summary']").inner_text()  # the command
    # inside Bokeh too: the operator's wedge (the largest, clockwise from twelve) shows the name as text
    pie = page.locator("section[id='cpu-operators'] div[data-chart] canvas").first
    pie.scroll_into_view_if_needed()
    box = pie.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + 125 + 60, box["y"] + 150, steps=4)
    page.wait_for_timeout(300)
    values = page.locator(".bk-tooltip-row-value span[data-value]")
    shown = [values.nth(i) for i in range(values.count()) if values.nth(i).inner_text() == SCRIPT]
    assert shown, values.all_inner_texts()
    assert shown[0].evaluate("e => e.children.length") == 0
    assert opened.dialogs == [] and opened.errors == []


@pytest.mark.parametrize("case", ["cpu-only", "no-framework", "three-nodes"])
def test_other_shapes_of_run_render_without_errors(case: str, tmp_path: Path, open_report):
    shapes = {"cpu-only": dict(gpus=0), "no-framework": dict(framework=False),
              "three-nodes": dict(nodes=("algo-1", "algo-2", "algo-3"))}
    planted = full_run(tmp_path / case, **shapes[case])
    opened = open_report(Path(build_report(str(planted.root))))
    opened.screenshot(f"report-{case}")
    _check(opened, planted.root)
    text = opened.page.locator("main").inner_text()
    assert "could not be built" not in text
    if case == "cpu-only":
        usage = opened.page.locator("section[id='system-usage']").inner_text()
        assert "the CPUs on node algo-1 are" in usage or "node algo-1 is underutilized" in usage
        assert "the job ran on the CPU only" in opened.page.locator("section[id='gpu-operators']").inner_text()
    if case == "no-framework":
        assert "No step information was profiled" in opened.page.locator("section[id='summary']").inner_text()
        assert "No framework metrics" in opened.page.locator("section[id='framework']").inner_text()
    if case == "three-nodes":
        for node in planted.nodes:
            assert opened.page.get_by_role("cell", name=node, exact=True).count() >= 6  # in every usage row
