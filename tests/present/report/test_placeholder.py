"""The page at report.html while a detached process writes the report: opened at once in Chromium it says what
is happening, and it turns into the report by itself once the report replaces it (atomically, as it is)."""

from __future__ import annotations

import re
from pathlib import Path

from stallwatch.present.report import build_report
from stallwatch.present.report.placeholder import RELOAD_S, placeholder_html
from stallwatch.store import run_files

from ._full_runs import Planted
from .conftest import OpenedReport


def test_the_placeholder_becomes_the_report_without_a_click(two_node_run: Planted, open_report, tmp_path):
    target = tmp_path / "report.html"
    hostile = str(tmp_path / "run-<script>alert(1)</script>")
    run_files.write_file_atomic(target, placeholder_html(hostile).encode())
    opened: OpenedReport = open_report(target)
    page = opened.page
    opened.screenshot("report-placeholder")
    assert page.title() == "stallwatch report — being written"
    assert f"stallwatch report '{hostile}'" in page.locator("code").inner_text()  # text, never run; quoted
    assert opened.errors == [] and opened.dialogs == [] and opened.refused == []
    assert re.search(rf"reloads itself every {RELOAD_S} s", page.locator("main").inner_text())
    build_report(str(two_node_run.root), target)  # what the detached `stallwatch report` does, atomically
    page.wait_for_selector("div[data-chart] canvas", timeout=60_000)
    assert page.title() == "stallwatch profiling report"
    assert page.locator("section[id='summary']").count() == 1
    assert opened.errors == [] and opened.dialogs == []
    assert Path(target).read_text()[:15] == "<!DOCTYPE html>"
