"""A real headless Chromium (the system's, driven by Playwright; no browser is downloaded) that opens a report
from its file:// URL with every request routed: file: and data: go through, anything else is refused and
recorded, so a report that reaches for the network fails its test. Screenshots go to test-artifacts/."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.present.report._full_runs import IMG, SCRIPT, Planted, full_run
from tests.store.s3_server import bucket, s3_env, s3_server  # noqa: F401  (pytest fixtures, for the S3 test)

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
RENDER_TIMEOUT_S = 60.0


@dataclass
class OpenedReport:
    """A report open in the browser, with everything it did while loading and rendering."""
    page: Any
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    refused: list[str] = field(default_factory=list)  # requests for anything but file: and data:
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)  # alert()/confirm()/prompt(): only injected code makes one

    def roots(self) -> int:
        """Charts in the page (one <div data-chart> each, filled by draw.js)."""
        return self.page.locator("div[data-chart]").count()

    def canvases(self) -> int:
        return self.page.locator("div[data-chart] canvas").count()

    def drawn_roots(self) -> int:
        """Charts drawn: a canvas, or the one line draw.js writes for a spec with nothing to draw (a pie of
        one slice is a sentence); a chart that failed ("could not be drawn") is not drawn."""
        charts = self.page.locator("div[data-chart]")  # locators reach into BokehJS's shadow roots
        return sum(1 for i in range(charts.count()) if charts.nth(i).locator("canvas").count() > 0
                   or (charts.nth(i).locator("p.na").count() > 0
                       and "could not be drawn" not in charts.nth(i).inner_text()))

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def open_report(browser: Any) -> Iterator[Callable[[Path], OpenedReport]]:
    """open_report(path): the file in a fresh browser context, once every chart has been drawn."""
    contexts = []

    def open_(path: Path) -> OpenedReport:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(context)
        page = context.new_page()
        opened = OpenedReport(page)
        page.on("console", lambda m: opened.errors.append(f"console.{m.type}: {m.text}") if m.type == "error"
                else None)
        page.on("pageerror", lambda exc: opened.errors.append(f"page error: {exc}"))
        page.on("dialog", lambda d: (opened.dialogs.append(d.message), d.dismiss()))

        def route(r: Any) -> None:
            url = r.request.url
            opened.requests.append(url)
            if url.startswith(("file:", "data:")):
                r.continue_()
            else:
                opened.refused.append(url)
                r.abort()

        context.route("**/*", route)
        page.goto(Path(path).resolve().as_uri())
        start = time.monotonic()
        while time.monotonic() < start + RENDER_TIMEOUT_S:  # draw.js draws after load: until every chart is drawn
            roots = opened.roots()
            if (roots or time.monotonic() > start + 5) and opened.drawn_roots() == roots:
                break
            page.wait_for_timeout(200)
        page.wait_for_timeout(300)
        return opened

    yield open_
    for c in contexts:
        c.close()


# -- generated runs, made once per session (tests/present/report/_full_runs.py names what is planted) ----------

@pytest.fixture(scope="session")
def two_node_run(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    """System + framework (2 ranks a node, collectives) + a detailed-profiling window; rules fire."""
    return full_run(tmp_path_factory.mktemp("report") / "two-nodes", nodes=("algo-1", "algo-2"), ranks=2)


@pytest.fixture(scope="session")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    """Markup in every name the run lets a user choose: a node, an operator, the command."""
    return full_run(tmp_path_factory.mktemp("report") / "hostile", nodes=("algo-1", IMG), operator_name=SCRIPT,
                    command=["python", "train.py", "--tag", SCRIPT])
