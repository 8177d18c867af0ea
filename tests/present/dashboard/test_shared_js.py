"""The dashboard draws with the report's renderer: it serves draw.js and BokehJS's two files (from the installed
bokeh package) and nothing else under /draw/, and its charts draw and answer the mouse under its own Content
Security Policy (no `eval`: BokehJS's CustomJS hovers are not used there) with a clean console."""

from __future__ import annotations

from typing import Any

from tests.present.dashboard.conftest import Dashboard


def test_draw_js_and_bokehjs_are_served_and_nothing_else(dashboard: Dashboard) -> None:
    for name, marker in (("draw.js", b"const Draw"), ("bokeh.min.js", b"Bokeh"), ("bokeh-api.min.js", b"Bokeh")):
        status, headers, body = dashboard.get(f"/draw/{name}")
        assert status == 200 and "javascript" in headers["content-type"] and marker in body[:200_000], name
    for name in ("bokeh-widgets.min.js", "..%2Fapp.py", "catalogue.py"):
        assert dashboard.get(f"/draw/{name}")[0] == 404, name
    assert dashboard.get("/draw/draw.js", auth=False)[0] in (401, 403)


def test_the_charts_draw_and_hover_under_the_pages_csp(browser: Any, dashboard: Dashboard) -> None:
    context = browser.new_context(viewport={"width": 1440, "height": 900})  # the CSP enforced
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(dashboard.link("#run=run-a&view=nodes"))
        # (selectors, not wait_for_function: the page's CSP refuses the strings Playwright evaluates)
        page.wait_for_selector("#chart-heat[data-cells]:not([data-cells='0'])", state="attached")
        page.wait_for_selector("#chart-tracks[data-ranks='2']", state="attached")
        page.wait_for_selector("#chart-cpu[data-points]:not([data-points='0'])", state="attached")
        for chart in ("#chart-heat", "#chart-cpu", "#chart-tracks"):
            page.locator(chart).scroll_into_view_if_needed()
            box = page.locator(chart).bounding_box()
            for fx in (0.3, 0.5, 0.7):
                page.mouse.move(box["x"] + box["width"] * fx, box["y"] + box["height"] * 0.6)
                page.wait_for_timeout(150)
        assert page.locator("#chart-heat .bk-Canvas, #chart-heat canvas").count() >= 1
    finally:
        context.close()
    assert errors == [], errors
