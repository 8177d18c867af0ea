"""Every view of both faces, looked at: for a real CPU-only run (a small PyTorch job under `stallwatch run`, with
a Python-profiling window), a real two-rank DDP run (gloo on CPU, under torchrun) and a generated two-node run,
the report and each dashboard view (Overview, Nodes, Ranks, Runs) are opened in one real Chromium at 1440 and
1024 px, saved as full-page screenshots ($STALLWATCH_SCREENS or /tmp/stallwatch-screens) and checked in DOM
terms: no table wider than its box, nothing wider than the viewport, no console error, no chart container
without data, one colour per series label across a page's charts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.report import build_report
from tests.present.dashboard.conftest import Dashboard, start_dashboard
from tests.present.report._full_runs import full_run
from tests.present.test_one_face import JOB

SCREENS = Path(os.environ.get("STALLWATCH_SCREENS") or "/tmp/stallwatch-screens")
WIDTHS = (1440, 1024)
RUN_VIEWS = ("overview", "nodes", "ranks")  # and Runs, the list of them all
DDP_JOB = Path(__file__).resolve().parents[1] / "torch" / "ddp_job.py"
RENDER_TIMEOUT_S = 30.0
VIEW_TIMEOUT_S = 10.0
pytestmark = pytest.mark.timeout(900)  # three runs (two of them real jobs), 26 pages, on two cores

# What overflows, what charts hold, which colour each series got: read in the page, one evaluation per look.
PROBE = """() => {
  const wide = [];
  for (const t of document.querySelectorAll('table')) {
    if (!t.offsetParent) continue;  // a hidden view's table
    let box = t.parentElement;
    while (box && box !== document.body && getComputedStyle(box).overflowX === 'visible') box = box.parentElement;
    box = box || document.body;
    if (box.scrollWidth > box.clientWidth + 1)
      wide.push({table: (t.closest('[id]') || {}).id || '',
                 caption: ((box.previousElementSibling || {}).textContent || '').slice(0, 80),
                 head: [...t.querySelectorAll('th')].map(h => h.textContent).join('|').slice(0, 200),
                 scroll: box.scrollWidth, client: box.clientWidth});
  }
  const charts = [];
  for (const c of document.querySelectorAll('[data-points]')) {
    if (!c.offsetParent) continue;
    charts.push({id: c.id || (c.closest('[id]') || {}).id || '', points: Number(c.dataset.points),
                 series: c.dataset.series || null});
  }
  const doc = document.documentElement;
  return {wide, charts, page: doc.scrollWidth, viewport: doc.clientWidth};
}"""


# -- the runs: one real job per kind, one generated multi-node run, one dashboard over them all ---------------


def _stallwatch(where: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "stallwatch.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=where, env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run name -> run directory, all under one root. With $STALLWATCH_SCREEN_RUNS, the runs are made there once
    and reused (to look at the pages again after a change without training again)."""
    keep = os.environ.get("STALLWATCH_SCREEN_RUNS")
    where = Path(keep) if keep else tmp_path_factory.mktemp("screens")
    root = where / "runs"
    if keep and (root / "multinode" / "report.html").exists():
        for run in root.iterdir():
            build_report(str(run))  # the report of the code under test
        return {run.name: run for run in sorted(root.iterdir())}
    where.mkdir(parents=True, exist_ok=True)
    (where / "job.py").write_text(JOB)
    out = {}
    cpu = root / "cpu"
    p = _stallwatch(where, "run", "--out", str(cpu), "--python-profiling", "3:4", "--", sys.executable,
                    str(where / "job.py"))
    assert p.returncode == 0, p.stderr
    out["cpu"] = cpu
    if shutil.which("torchrun") is not None:
        ddp = root / "ddp"
        p = _stallwatch(where, "run", "--out", str(ddp), "--", sys.executable, "-m", "torch.distributed.run",
                        "--standalone", "--nproc_per_node", "2", str(DDP_JOB), str(where), timeout=240)
        assert p.returncode == 0, p.stderr
        out["ddp"] = ddp
    out["multinode"] = full_run(root / "multinode", nodes=("algo-1", "algo-2"), ranks=2).root
    for run in out.values():
        if not (run / "report.html").exists():
            build_report(str(run))
    return out


@pytest.fixture(scope="module")
def served(runs: dict[str, Path]) -> Iterator[Dashboard]:
    d = start_dashboard(next(iter(runs.values())).parent)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def looked(browser: Any, runs: dict[str, Path], served: Dashboard) -> dict[str, dict[str, Any]]:
    """Every page looked at once (one browser, one context per width): name -> what the probe saw, the
    console errors, the screenshot."""
    SCREENS.mkdir(parents=True, exist_ok=True)
    seen: dict[str, dict[str, Any]] = {}
    for width in WIDTHS:
        context = browser.new_context(viewport={"width": width, "height": 900}, bypass_csp=True)
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            ids = _dashboard_ids(served, runs)
            for run_id, run in runs.items():
                page.goto((run / "report.html").resolve().as_uri())  # each page loaded afresh: no state carried
                _settle_report(page)
                seen[f"report-{run_id}-{width}"] = _look(page, errors, f"report-{run_id}-{width}")
                for view in RUN_VIEWS:
                    page.goto(served.link(f"#run={ids[run_id]}&view={view}"))
                    _settle_dashboard(page, view)
                    seen[f"{view}-{run_id}-{width}"] = _look(page, errors, f"{view}-{run_id}-{width}")
            page.goto(served.link("#view=runs"))  # every run's row (a run's address at load opens that run)
            _settle_dashboard(page, "runs")
            seen[f"runs-{width}"] = _look(page, errors, f"runs-{width}")
        finally:
            context.close()
    return seen


def _dashboard_ids(served: Dashboard, runs: dict[str, Path]) -> dict[str, str]:
    """Each run's id in the dashboard's list (found by its directory)."""
    rows = served.json("/api/runs")["runs"]
    out = {}
    for name, run in runs.items():
        (row,) = [r for r in rows if any(isinstance(v, str) and (v == str(run) or v.rstrip("/").endswith("/" + name))
                                         for v in r.values())]
        out[name] = str(row["id"])
    return out


def _settle_report(page: Any) -> None:
    """Until every chart is drawn: draw.js marks each chart element with data-points, or leaves a line saying
    why it drew nothing (an embedded Bokeh document, before it, has a root with children)."""
    start = time.monotonic()
    while time.monotonic() < start + RENDER_TIMEOUT_S:
        left = page.evaluate("""() => [...document.querySelectorAll('[data-chart]')]
                                  .filter(c => !c.dataset.points && !c.textContent.trim()).length
                                + [...document.querySelectorAll('div[data-root-id]')]
                                  .filter(r => !r.children.length && !r.shadowRoot).length""")
        if left == 0:
            break
        page.wait_for_timeout(200)
    page.wait_for_timeout(300)


def _settle_dashboard(page: Any, view: str) -> None:
    """Until the view has rendered what it fetched: its tables filled, its charts given their data."""
    page.wait_for_selector(f"#view-{view}.active", timeout=30_000)
    start = time.monotonic()
    while time.monotonic() < start + VIEW_TIMEOUT_S:  # a chart left empty then is what the check reports
        pending = page.evaluate(f"""() => {{
            const v = document.querySelector('#view-{view}');
            const charts = [...v.querySelectorAll('[data-points]')].filter(c => c.offsetParent);
            const empty = charts.filter(c => !Number(c.dataset.points)).length;
            const drawn = v.querySelectorAll('[data-cells], [data-bars], tbody tr, table tr').length;
            return (drawn === 0 && charts.length === 0) || empty > 0 ? 1 : 0; }}""")
        if not pending:
            break
        page.wait_for_timeout(250)
    page.wait_for_timeout(300)


def _look(page: Any, errors: list[str], name: str) -> dict[str, Any]:
    page.screenshot(path=str(SCREENS / f"{name}.png"), full_page=True)
    seen = page.evaluate(PROBE)
    seen["errors"] = list(errors)
    errors.clear()
    seen["report"] = name.startswith("report-")
    return seen


# -- the checks -----------------------------------------------------------------------------------------------


def test_every_page_was_shot(looked: dict[str, dict[str, Any]], runs: dict[str, Path]) -> None:
    assert len(looked) == (len(runs) * (1 + len(RUN_VIEWS)) + 1) * len(WIDTHS)
    for name in looked:
        assert (SCREENS / f"{name}.png").stat().st_size > 10_000, name


def test_no_table_is_wider_than_its_box(looked: dict[str, dict[str, Any]]) -> None:
    assert _too_wide(looked) == {}


def test_nothing_is_wider_than_the_viewport(looked: dict[str, dict[str, Any]]) -> None:
    assert _past_viewport(looked) == {}


def _too_wide(looked: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Pages whose tables are wider than their box."""
    return {name: seen["wide"] for name, seen in looked.items() if seen["wide"]}


def _past_viewport(looked: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {name: (seen["page"], seen["viewport"]) for name, seen in looked.items()
            if seen["page"] > seen["viewport"] + 1}


def test_no_console_error(looked: dict[str, dict[str, Any]]) -> None:
    errors = {name: seen["errors"] for name, seen in looked.items() if seen["errors"]}
    assert errors == {}, errors


def test_every_dashboard_chart_has_data(looked: dict[str, dict[str, Any]]) -> None:
    _charts_have_data({n: s for n, s in looked.items() if not s["report"]})


def test_one_colour_per_series_on_each_dashboard_page(looked: dict[str, dict[str, Any]]) -> None:
    _one_colour_per_series({n: s for n, s in looked.items() if not s["report"]})


def test_the_reports_charts(looked: dict[str, dict[str, Any]]) -> None:
    reports = {n: s for n, s in looked.items() if s["report"]}
    assert all(s["charts"] for s in reports.values()), "a report drew no chart"
    _charts_have_data(reports)
    _one_colour_per_series(reports)


def _charts_have_data(pages: dict[str, dict[str, Any]]) -> None:
    empty = {name: [c["id"] for c in seen["charts"] if not c["points"]] for name, seen in pages.items()}
    assert {k: v for k, v in empty.items() if v} == {}


def _one_colour_per_series(pages: dict[str, dict[str, Any]]) -> None:
    """A label (a phase, a metric) has one colour in every chart of a page that names it."""
    clashes = {}
    for name, seen in pages.items():
        colours: dict[str, set[str]] = {}
        for chart in seen["charts"]:
            for label, colour in json.loads(chart["series"] or "{}").items():
                colours.setdefault(label, set()).add(str(colour).lower())
        mixed = {label: sorted(c) for label, c in colours.items() if len(c) > 1}
        if mixed:
            clashes[name] = mixed
    assert clashes == {}, clashes


def test_heatmap_cells_where_snapshots_exist(served: Dashboard, runs: dict[str, Path]) -> None:
    """Between a node's first and last snapshot every heatmap column holds a value: a blank column there read as
    lost data while the sampler ran (real runs' snapshots are a hair off their interval)."""
    rows = {str(r["id"]): r for r in served.json("/api/runs")["runs"]}
    for run, run_id in _dashboard_ids(served, runs).items():
        for name in rows[run_id]["nodes"]:
            heat = served.json(f"/api/run/{run_id}/heatmap?node={name}")
            columns = list(zip(*heat["values"])) if heat.get("values") else []
            assert columns, (run, name)
            blank = [i for i, col in enumerate(columns) if all(v is None for v in col)]
            assert blank == [], (run, name, blank, len(columns))


def test_a_python_captures_functions_are_on_the_overview(browser: Any, served: Dashboard,
                                                       runs: dict[str, Path]) -> None:
    """The CPU run's Python-profiling window: its top functions on the dashboard's Overview, as the report lists
    them (the summary stored with the window, `RunAnalysis.python_functions`)."""
    (window,) = RunAnalysis(str(runs["cpu"])).python_functions
    assert window.top, window
    answer = served.json(f"/api/run/{_dashboard_ids(served, runs)['cpu']}/functions")
    assert [f["function"] for f in answer["windows"][0]["functions"]] == [f.function for f in window.top]
    page = browser.new_page()
    try:
        page.goto(served.link(f"#run={_dashboard_ids(served, runs)['cpu']}&view=overview"))
        page.wait_for_selector("#functions table.functions tr >> nth=1", timeout=30_000)
        shown = page.eval_on_selector_all("#functions table.functions tr td:first-child",
                                          "cells => cells.map(c => c.textContent)")
    finally:
        page.close()
    assert shown == [f.function for f in window.top]


def test_the_nodes_cpu_chart_shows_the_jobs_own_cpu(looked: dict[str, dict[str, Any]]) -> None:
    """Beside all cores, the job's own processes (the sampler's proc/cpu_util), in a colour of their own: on a busy
    host, whose CPU it was (the real runs; the generated one records no job CPU)."""
    for name, seen in looked.items():
        if not name.startswith(("nodes-cpu-", "nodes-ddp-")):
            continue
        (cpu,) = [c for c in seen["charts"] if c["id"] == "chart-cpu"]
        series = json.loads(cpu["series"] or "{}")
        assert "this job" in series and series["this job"] != series["all cores"], (name, series)
