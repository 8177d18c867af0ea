"""Addresses and clicks in real headless Chromium: on a folder of runs, a real click on a run's row opens it; a
changed hash (typed, pasted, back and forward) re-renders the page for the run and view it names; a run whose
rules were never stored draws its summary before its findings, which follow."""

from __future__ import annotations

from typing import Any

from tests.present.dashboard.conftest import Dashboard
from tests.present.dashboard.test_browser import page  # noqa: F401  (the fixture)


def test_row_click_and_hash_changes_render(page: Any, dashboard: Dashboard) -> None:  # noqa: F811
    page.goto(dashboard.link())
    page.wait_for_selector("#view-runs.active #runs-table tr[data-run=run-b]")
    page.locator("#runs-table tr[data-run=run-b] td").first.click()
    page.wait_for_selector("#view-overview.active #summary-table tr")
    assert "run=run-b" in page.url and "view=overview" in page.url
    page.wait_for_function("document.querySelector('#run-name').textContent.length > 0")
    b_name = page.text_content("#run-name")

    page.evaluate("location.hash = '#run=run-a&view=ranks'")
    page.wait_for_selector("#view-ranks.active")
    page.wait_for_function("document.querySelector('#chart-rank-steps').dataset.cells > 0")
    assert page.text_content("#run-name") != b_name

    page.evaluate("location.hash = '#run=run-a&view=nodes&node=algo-2'")
    page.wait_for_selector("#view-nodes.active")
    page.wait_for_function("document.querySelector('#node-pick').value === 'algo-2'")

    page.go_back()  # the ranks view of run-a again
    page.wait_for_selector("#view-ranks.active")
    page.evaluate("location.hash = '#view=runs'")
    page.wait_for_selector("#view-runs.active #runs-table tr[data-run=run-a]")


def test_summary_first_findings_after(page: Any, dashboard: Dashboard) -> None:  # noqa: F811
    """run-b's rules were never stored: evaluated on the server while the page already shows the summary."""
    page.goto(dashboard.link("#run=run-b&view=overview"))
    page.wait_for_selector("#summary-table tr")
    page.wait_for_function("document.querySelector('#verdict').textContent.length > 0", timeout=60_000)
    assert page.text_content("#findings-progress") == ""
    assert page.locator("#rules details").count() >= 10
