"""The dashboard as a person sees it, in headless Chromium against a real `stallwatch dashboard`: the
Overview's findings and rules, the Nodes charts, a finding opening the Nodes view, the Ranks heatmaps and the
Runs list; no request leaves the server, no script error, names shown as text. Screenshots go to
test-artifacts/ (dashboard-*.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


@pytest.fixture(scope="module")
def page(browser: Any, served) -> Any:
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(served.url))
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.errors, page.refused = [], []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))

    def route(r: Any) -> None:
        if r.request.url.startswith(origin + "/"):
            r.continue_()
        else:
            page.refused.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page.goto(served.url + "#two-nodes")
    page.wait_for_selector("#findings li", timeout=60_000)
    yield page
    context.close()


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def test_overview_shows_the_job_the_findings_and_every_rule(page):
    _shot(page, "overview")
    assert page.locator("#run-name").inner_text() == "two-nodes"
    assert page.locator("#summary .card").count() >= 6
    assert page.locator("#findings li").count() >= 1 and page.locator("#verdict").inner_text()
    assert page.locator("#rules tr").count() >= 14  # a header and every built-in rule
    assert page.locator("#usage tr").count() > 2
    assert page.locator("#live").get_attribute("class") == "on"  # the event stream is open
    assert page.errors == [] and page.refused == []


def test_nodes_draw_every_panel_and_a_finding_opens_its_node(page):
    page.click("#tabs button[data-tab=nodes]")
    page.wait_for_selector("#panels .panel svg path", timeout=30_000)
    panels = page.locator("#panels .panel")
    assert panels.count() >= 2
    assert page.locator("#panels path[d^='M']").count() >= panels.count()  # a drawn line in each
    assert "last sample" in page.locator("#node-badge").inner_text()
    _shot(page, "nodes")
    page.select_option("#node-pick", "algo-2")
    page.wait_for_timeout(500)
    page.click("#tabs button[data-tab=overview]")
    page.locator("#findings li").first.click()
    page.wait_for_selector("#nodes.tab.on #panels .panel svg", timeout=30_000)
    assert page.locator("#nodes").is_visible() and not page.locator("#overview").is_visible()
    assert page.errors == [] and page.refused == []


def test_ranks_and_runs(page):
    page.click("#tabs button[data-tab=ranks]")
    page.wait_for_selector("#heat-step canvas", timeout=30_000)
    assert page.locator("#heat-wait canvas, #heat-wait p").count() == 1
    assert "Straggler" in page.locator("#straggler").inner_text()
    _shot(page, "ranks")
    page.click("#tabs button[data-tab=runs]")
    page.wait_for_selector("#run-list a", timeout=30_000)
    assert sorted(page.locator("#run-list a").all_inner_texts()) == ["cpu-only", "two-nodes"]
    page.locator("#run-list a", has_text="cpu-only").click()
    for _ in range(150):  # (the page's CSP refuses wait_for_function's eval)
        if page.locator("#run-name").inner_text() == "cpu-only":
            break
        page.wait_for_timeout(200)
    assert page.locator("#run-name").inner_text() == "cpu-only"
    _shot(page, "runs-cpu-only")
    assert page.errors == [] and page.refused == []
