"""The report and the dashboard as one face, on one real run (a small PyTorch CPU training job under
`stallwatch run`, its report written at the end, the run served by a real dashboard, the page in Chromium):
every phase has one colour, the catalogue's, in every chart of the report (as draw.js drew them: each chart's
data-series) and of the dashboard; the dashboard formats numbers as the report's code does; and
`stallwatch summary --json` prints the document the dashboard's API serves."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stallwatch import catalogue
from stallwatch.timeutil import format_duration
from stallwatch.units import format_keyed, format_value
from tests.present.dashboard.conftest import Dashboard, start_dashboard

SCREENS = Path(os.environ.get("STALLWATCH_SCREENS") or "/tmp/stallwatch-screens")
JOB = '''
import time, torch
def slow(batch):  # a loader that takes a moment: the steps wait for data
    time.sleep(0.003)
    return torch.stack(batch)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
train = torch.utils.data.DataLoader(list(torch.randn(96, 16)), batch_size=4, collate_fn=slow)
evaluate = torch.utils.data.DataLoader(list(torch.randn(32, 16)), batch_size=4, collate_fn=slow)
for epoch in range(2):
    model.train()
    for xb in train:
        opt.zero_grad(); model(xb).pow(2).mean().backward(); opt.step()
    model.eval()
    with torch.no_grad():
        for xb in evaluate:
            model(xb)
print("trained", flush=True)
'''


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of the job above, with its report (outside a terminal `stallwatch run` writes it before
    it returns)."""
    where = tmp_path_factory.mktemp("one-face")
    (where / "job.py").write_text(JOB)
    root = where / "runs" / "real"
    p = subprocess.run([sys.executable, "-m", "stallwatch.cli", "run", "--out", str(root), "--", sys.executable,
                        str(where / "job.py")], capture_output=True, text=True, timeout=300, cwd=where)
    assert p.returncode == 0, p.stderr
    assert (root / "report.html").exists(), p.stderr
    return root


@pytest.fixture(scope="module")
def served(real_run: Path) -> Iterator[Dashboard]:
    d = start_dashboard(real_run.parent)
    yield d
    d.stop()


# -- the report's charts ------------------------------------------------------------------------------------


def _embedded(report: str) -> dict[str, Any]:
    """The report's one JSON script: the catalogue and every chart's spec."""
    text = report[report.index('id="stallwatch-charts">') + len('id="stallwatch-charts">'):]
    return json.loads(text[:text.index("</script>")])


@pytest.fixture(scope="module")
def report_colours(browser: Any, real_run: Path) -> dict[str, set[str]]:
    """Legend label / phase -> the colours draw.js drew it in, over every chart of the report opened in
    Chromium (each chart's data-series), with no console error."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        pg = context.new_page()
        errors: list[str] = []
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto((real_run / "report.html").resolve().as_uri())
        pg.wait_for_function("() => [...document.querySelectorAll('[data-chart]')].every(e => e.dataset.series)")
        series = pg.evaluate("() => [...document.querySelectorAll('[data-chart]')].map(e => e.dataset.series)")
        assert errors == []
    finally:
        context.close()
    found: dict[str, set[str]] = {}
    for one in series:
        for label, colour in json.loads(one).items():
            found.setdefault(label, set()).add(colour.lower())
    return found


def test_every_phase_has_its_one_colour_in_every_chart_of_the_report(real_run: Path,
                                                                       report_colours: dict[str, set[str]]):
    found = report_colours
    phases = {label: colours for label, colours in found.items() if catalogue.phase(label) is not None}
    # the job's parts and the steps' parts are drawn (pies of where the time went)
    assert {"Training loop", "forward", "backward", "optimizer step", "waiting for data"} <= set(phases), found
    for label, colours in phases.items():
        assert colours == {catalogue.colour(label).lower()}, (label, colours)
    assert all(label.strip() for label in found), "a slice or line without a name"
    # the heatmaps' colour scale is the catalogue's (the dashboard's too: test below), carried to draw.js
    embedded = _embedded((real_run / "report.html").read_text(encoding="utf-8"))
    assert tuple(embedded["catalogue"]["heat_palette"]) == catalogue.HEAT_PALETTE
    assert any(c["kind"] in ("heatmap", "step_heatmap") for c in embedded["charts"])


# -- the dashboard ------------------------------------------------------------------------------------------


@pytest.fixture
def page(browser: Any, served: Dashboard) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900}, bypass_csp=True)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    assert errors == []
    context.close()


def test_the_dashboard_draws_each_phase_in_the_reports_colour(report_colours: dict[str, set[str]], page: Any,
                                                              served: Dashboard, real_run: Path):
    report = report_colours
    SCREENS.mkdir(parents=True, exist_ok=True)
    page.goto(served.link("#run=real&view=overview"))
    page.wait_for_selector("#phase-pie[data-colours]")
    pie = json.loads(page.get_attribute("#phase-pie", "data-colours"))
    assert set(pie) == {"Initialization", "Training loop", "Finalization"}
    page.wait_for_selector(".finding, #findings p")
    for summary in page.locator(".finding details summary, #rules details summary").all()[:3]:
        summary.click()  # evidence and a rule's details open, to be looked at
    page.screenshot(path=str(SCREENS / "one-face-overview.png"), full_page=True)
    for card in page.locator(".finding").all():  # a finding in the colour of the report's verdict of its level
        severity = card.get_attribute("class").split()[-1]
        colour = catalogue.LEVELS[catalogue.SEVERITY_LEVEL[severity]][0]
        assert card.evaluate("e => getComputedStyle(e).borderLeftColor") == _rgb(colour)
    page.goto(served.link("#run=real&view=nodes"))
    page.wait_for_selector("#chart-steps[data-colours]")
    page.wait_for_selector("#chart-heat[data-palette]")
    steps = json.loads(page.get_attribute("#chart-steps", "data-colours"))
    assert {"waiting for data", "forward", "backward", "optimizer step"} <= set(steps)
    page.screenshot(path=str(SCREENS / "one-face-nodes.png"), full_page=True)
    for label, colour in {**pie, **steps}.items():
        assert colour.lower() == catalogue.colour(label).lower(), label
        if label in report:  # the same phase, the same colour, on both faces
            assert report[label] == {colour.lower()}, (label, report[label], colour)
    assert set(report) & set(steps) >= {"forward", "backward"}
    # a CPU-only node: no empty GPU charts, one line saying why
    assert page.is_hidden("#chart-gpu") and page.is_hidden("#chart-gpumem")
    assert "No GPU on node" in page.text_content("#gpu-na")


def test_the_page_formats_numbers_as_the_reports_code_does(page: Any, served: Dashboard):
    page.goto(served.link("#run=real&view=overview"))
    page.wait_for_selector("#summary-table tr")
    cases = [(0.0012e6, "B/s"), (999_800.0, "B/s"), (1234.0, "B/s"), (0.04, "s"), (0.0, "s"), (3.2, "s"),
             (7_300.0, "s"), (93.21, "%"), (0.0123, "%"), (1_234_567.0, "count"), (2.5e9, "B"), (12.345, "ms"),
             (-0.5, "%"), (None, "%")]
    shown = page.evaluate("cases => cases.map(([v, u]) => Cat.fmt(v, u))", [list(c) for c in cases])
    assert shown == [format_value(v, u) for v, u in cases]
    keyed = [("time_at_stake_s", 2.34), ("wait_share", 31.52), ("pid", 6439), ("rank", 3), ("rss_bytes", 3.2e8),
             ("start_us", 1_764_382_882_000_000), ("excess_us", 1234.0), ("triggered", True), ("steps", 12_000),
             ("node", "algo-1"), ("quota_cores", None), ("excess_s_per_step", 0.04502333333333334),
             ("first_step", 20)]
    assert page.evaluate("cases => cases.map(([k, v]) => Cat.value(k, v))", [list(c) for c in keyed]) == \
        [format_keyed(k, v) for k, v in keyed]
    assert "0.0012" not in " ".join(shown) and "1.2 kB/s" in shown
    durations = [0.588, 0.0, 59.94, 65.2, 3_723.0, 90_061.5, None]  # time at stake, a job's duration
    assert page.evaluate("cases => cases.map(Cat.duration)", durations) == \
        [format_duration(d) if d is not None else "–" for d in durations]
    heat = page.evaluate("[Cat.heat(0), Cat.heat(0.5), Cat.heat(1), Cat.heat(null)]")
    assert heat == [catalogue.HEAT_PALETTE[0], catalogue.HEAT_PALETTE[128], catalogue.HEAT_PALETTE[-1],
                    catalogue.NO_DATA_COLOUR]  # as Bokeh's LinearColorMapper picks them in the report
    # evidence and rule details are tables of formatted values, not raw JSON
    page.wait_for_selector("#rules details")
    assert page.locator("#rules pre, #findings pre").count() == 0
    details = page.locator("#rules .kv-data").all_inner_texts()
    assert details and not any(re.search(r"\d\.\d{6,}", t) for t in details), details


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


# -- one document ---------------------------------------------------------------------------------------------


def test_summary_json_is_the_document_the_api_serves(served: Dashboard, real_run: Path):
    p = subprocess.run([sys.executable, "-m", "stallwatch.cli", "summary", str(served.root / "real"), "--json"],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    printed = json.loads(p.stdout)
    api = served.json("/api/run/real/document")
    assert printed == api
    assert printed["schema"] == "stallwatch.summary/2" and printed["fate"] == printed["exit"]
    assert printed["fate"]["state"] == "succeeded" and printed["findings"]["fate"] == printed["fate"]
    assert [n["name"] for n in printed["nodes"]] and printed["total_steps"] > 0
    # the page's summary is the same model: its job part, the same values
    summary = served.json("/api/run/real/summary")
    # served-run keys, the live counts' (while a job runs), shares from rollups
    shared = set(summary) - {"id", "version", "progress", "phase_shares", "live_us", "latest_step", "steps_per_s"}
    assert shared >= {"fate", "exit", "nodes", "steps", "training_loop_s", "parts_s", "duration_s"}
    assert {k: summary[k] for k in shared} == {k: printed[k] for k in shared}
