"""The page in real headless Chromium (one browser for the module, tests/present/conftest.py) against a real
dashboard: Overview shows the findings and the summary, Nodes draws its charts, a finding opens Nodes on the
windows where it fired, a core can be picked, Ranks and Runs render, the download is the report, a run's HTML
payload stays text, nothing is fetched from anywhere else and the console stays clean. Screenshots are kept
in the test's tmp dir (tests/present/dashboard/screens when STALLWATCH_SCREENS is set) to be looked at."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.present.dashboard.conftest import Dashboard
from tests.present.report._full_runs import BOTTLENECK, IMG


@pytest.fixture
def page(browser: Any, dashboard: Dashboard) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1300, "height": 900}, accept_downloads=True,
                                  bypass_csp=True)  # wait_for_function evaluates strings; the CSP is tested in test_app
    pg = context.new_page()
    pg.errors = []  # type: ignore[attr-defined]
    pg.foreign = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))

    def route(r: Any) -> None:
        if r.request.url.startswith(dashboard.url):
            r.continue_()
        else:  # nothing from a CDN or the internet
            pg.foreign.append(r.request.url)
            r.abort()
    pg.route("**/*", route)
    yield pg
    assert pg.errors == [], pg.errors
    assert pg.foreign == [], pg.foreign
    context.close()


def _shots(tmp_path: Path) -> Path:
    where = Path(os.environ["STALLWATCH_SCREENS"]) if os.environ.get("STALLWATCH_SCREENS") else tmp_path
    where.mkdir(parents=True, exist_ok=True)
    return where


def test_overview_then_nodes_via_a_finding(page: Any, dashboard: Dashboard, tmp_path: Path) -> None:
    shots = _shots(tmp_path)
    page.goto(dashboard.link("#run=run-a&view=overview"))
    page.wait_for_selector(".finding[data-rule=CPUBottleneck]")
    assert "CPU" in page.text_content(".finding[data-rule=CPUBottleneck] .title")
    assert page.locator("#rules details").count() >= 10
    page.wait_for_selector("#usage-table tr >> nth=3")
    assert "algo-2" in page.text_content("#summary-table")
    assert page.get_attribute("#progress-chart", "data-points") not in (None, "0")
    page.screenshot(path=str(shots / "overview.png"), full_page=True)

    page.click(".finding[data-rule=CPUBottleneck] button.show-on-nodes")
    page.wait_for_function("document.querySelector('#chart-cpu').dataset.points > 0")
    assert "view=nodes" in page.url and "from=" in page.url
    x0, x1 = (int(page.get_attribute("#chart-cpu", a)) for a in ("data-x0", "data-x1"))
    start = 1_700_000_000_000_000 + BOTTLENECK[0] * 500_000
    assert x0 < start < x1 and x1 - x0 < 200_000_000  # the window where it fired, not the whole run
    for chart in ("#chart-gpu", "#chart-net", "#chart-gpumem", "#chart-mem"):
        assert int(page.get_attribute(chart, "data-points")) > 0
    assert page.get_attribute("#chart-gpu", "data-x0") == page.get_attribute("#chart-cpu", "data-x0")  # synced
    before = int(page.get_attribute("#chart-cpu", "data-points"))
    page.check("#core-pick input[data-device=cpu0]")
    assert int(page.get_attribute("#chart-cpu", "data-points")) > before
    page.wait_for_function("document.querySelector('#chart-steps').dataset.bars == '30'")
    page.wait_for_function("document.querySelector('#chart-heat').dataset.cells > 0")
    assert "algo-1" in page.text_content("#node-badges")
    page.screenshot(path=str(shots / "nodes.png"), full_page=True)

    # zoom with the wheel: every chart follows, the data is asked again for the new range
    page.locator("#chart-cpu").scroll_into_view_if_needed()
    box = page.locator("#chart-cpu").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, -300)
    page.wait_for_function(f"document.querySelector('#chart-net').dataset.x0 > {x0}")
    assert page.get_attribute("#chart-net", "data-x0") == page.get_attribute("#chart-cpu", "data-x0")

    # brushing the framework timeline lists what happened in the interval (over the whole run: the finding's
    # window is after the training loop, without events to draw)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    zoomed = page.get_attribute("#chart-cpu", "data-x0")
    page.click("#reset-zoom")
    # the reset redrew every chart over the whole run (linked charts agree on the zoomed range before it, too)
    page.wait_for_function(f"""() => {{ const e = document.querySelector('#chart-events').dataset;
        return Number(e.x0) < {zoomed} && e.x0 === document.querySelector('#chart-cpu').dataset.x0; }}""")
    page.wait_for_load_state("networkidle")
    page.locator("#chart-events").scroll_into_view_if_needed()
    for _ in range(3):  # a drag that lands while a loaded machine still lays the redrawn plot out is not a brush
        eb = page.locator("#chart-events").bounding_box()
        page.mouse.move(eb["x"] + 100, eb["y"] + eb["height"] / 2)  # inside the plot (axis on the left, legend above)
        page.mouse.down()
        page.mouse.move(eb["x"] + eb["width"] - 80, eb["y"] + eb["height"] / 2, steps=4)
        page.mouse.up()
        try:
            page.wait_for_selector("#brush-list p", timeout=10_000)
            break
        except PlaywrightTimeout:
            continue
    page.wait_for_selector("#brush-list p", timeout=1_000)
    assert "steps" in page.text_content("#brush-list")


def test_ranks_runs_download_and_escaping(page: Any, dashboard: Dashboard, tmp_path: Path) -> None:
    shots = _shots(tmp_path)
    page.goto(dashboard.link("#run=run-a&view=ranks"))
    page.wait_for_function("document.querySelector('#chart-rank-steps').dataset.cells > 0")
    page.screenshot(path=str(shots / "ranks.png"), full_page=True)
    page.click("#tabs button[data-view=runs]")
    page.wait_for_selector("#runs-table tr[data-run=run-xss]")
    # two runs compared, as `stallwatch compare` says it
    page.select_option("#compare-baseline", "run-b")
    page.select_option("#compare-run", "run-a")
    page.click("#compare-form button")
    page.wait_for_selector("#compare-verdict")
    verdict = page.text_content("#compare-verdict")
    assert "run-a" in verdict and "run-b" in verdict and ("slower" in verdict or "faster" in verdict), verdict
    assert page.locator("#compare table").count() >= 2  # step times and phases at least
    page.screenshot(path=str(shots / "runs.png"), full_page=True)
    page.click("#runs-table tr[data-run=run-xss]")
    page.wait_for_selector("#summary-table tr")
    assert IMG in page.text_content("#summary-table")  # shown as text
    assert page.locator("img").count() == 0
    with page.expect_download() as dl:
        page.click("#download")
    path = dl.value.path()
    assert b"stallwatch profiling report" in Path(path).read_bytes()
