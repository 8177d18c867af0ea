"""Run comparison and cost on real PyTorch runs: a starved loader against its fixed version (more workers) —
the finding goes away, steps get faster, the data wait's share drops; `--fail-if-slower` fails a CI job on the
regression; the report gains the comparison and the cost; the cost splits off what waiting cost."""

from __future__ import annotations

import json
import sys

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.compare import compare
from stallwatch.records import DATA_WAIT, TRAIN
from tests.analyze.test_accuracy import _script
from tests.collect._support import Background

# 2 ms a sample, 8 a batch: a starved step is ~4x a fixed one, so even a loaded CI machine's tail (p90) keeps them apart
STARVED = dict(sample_s=0.002, compute_s=0.005, stalls=[], steps=200, workers=0)
FIXED = dict(STARVED, sample_s=0.0)  # the fix: the samples cached in memory once, not loaded at every step


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two runs side by side: independent jobs (their own directories); what is compared are CPU-work shares
    and step-time ratios far apart (the planted work is CPU time, which stretches alike on a shared machine)."""
    out, jobs = {}, {}
    try:
        for name, settings in (("starved", STARVED), ("fixed", FIXED)):
            tmp = tmp_path_factory.mktemp(name)
            jobs[name] = Background(tmp, "run", "--out", str(tmp / "run"), "--", sys.executable,
                                    str(_script(tmp, **settings)), str(tmp / "onset.json"))
            out[name] = tmp / "run"
        for job in jobs.values():
            assert job.wait(240) == 0, job.stderr
    finally:
        for job in jobs.values():
            job.kill_all()
    return out


def test_the_fixed_run_against_the_starved_one(runs):
    starved, fixed = RunAnalysis(str(runs["starved"])), RunAnalysis(str(runs["fixed"]))
    c = compare(starved.comparison_figures, fixed.comparison_figures)
    assert c.step_times[TRAIN][0].steps == c.step_times[TRAIN][1].steps == 200
    assert c.slower_pct() < -20  # the fixed loop's median step is much faster
    wait = next(p for p in c.phases[TRAIN] if p.name == DATA_WAIT)
    assert wait.baseline > 25 and wait.run < wait.baseline / 2
    assert any("waits for data" in t for t in c.findings_gone) and not c.findings_appeared
    assert c.notes == []  # same shape: nothing to warn about
    back = compare(fixed.comparison_figures, starved.comparison_figures)
    assert back.slower_pct() > 20 and back.findings_appeared == c.findings_gone


def test_compare_cli_text_json_and_fail_if_slower(run_stallwatch, runs):
    p = run_stallwatch("compare", str(runs["starved"]), str(runs["fixed"]))
    assert p.returncode == 0, p.stderr
    assert "faster than the baseline's" in p.stdout and "went away" in p.stdout
    p = run_stallwatch("compare", str(runs["fixed"]), str(runs["starved"]), "--json", "--fail-if-slower", "10")
    assert p.returncode == 1, p.stderr  # the starved run regressed against the fixed baseline
    doc = json.loads(p.stdout)
    assert doc["schema"] == "stallwatch.compare/1" and doc["regression"]["failed"] is True
    assert doc["regression"]["slower_pct"] > 10
    assert "slower than the baseline's (limit 10 %)" in p.stderr
    p = run_stallwatch("compare", str(runs["starved"]), str(runs["fixed"]), "--fail-if-slower", "10",
                       "--quantile", "0.9")
    assert p.returncode == 0, p.stderr


def test_cost_splits_off_the_waiting_and_advises(run_stallwatch, runs):
    starved = RunAnalysis(str(runs["starved"]), price_per_hour=32.77)
    cost = starved.cost
    assert cost.total == pytest.approx(32.77 * starved.summary.duration_s / 3600)
    assert sum(cost.parts.values()) == pytest.approx(cost.total, rel=1e-6)
    assert 0 < cost.waiting["data wait"] < cost.parts["Training loop"]
    assert any("fix the data pipeline" in a.title or "CPU-bound" in a.title for a in cost.advice)
    assert RunAnalysis(str(runs["starved"])).cost is None  # no price, no cost
    p = run_stallwatch("summary", str(runs["starved"]), "--price-per-hour", "32.77", "--json")
    doc = json.loads(p.stdout)
    assert doc["cost"]["total"] == pytest.approx(cost.total, rel=1e-3) and doc["cost"]["waiting"]["data wait"] > 0
    p = run_stallwatch("summary", str(runs["starved"]), "--price-per-hour", "32.77")
    assert "Cost: " in p.stdout and "per node-hour" in p.stdout
    p = run_stallwatch("summary", str(runs["starved"]), "--price-per-hour", "cheap")
    assert p.returncode == 2 and "is not a number" in p.stderr


def test_the_report_gains_the_comparison_and_the_cost(run_stallwatch, runs, tmp_path):
    out = tmp_path / "report.html"
    p = run_stallwatch("report", str(runs["fixed"]), "--baseline", str(runs["starved"]), "--price-per-hour", "4.1",
                       "-o", str(out))
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    assert 'id="comparison"' in html and "Compared with the baseline" in html
    assert 'id="cost"' in html and "Cost and right-sizing" in html
    assert "faster than the baseline" in html


def test_run_with_a_price_prints_the_cost_and_keeps_it_in_the_run(run_stallwatch, tmp_path):
    run = tmp_path / "run"
    p = run_stallwatch("run", "--out", str(run), "--price-per-hour", "3.06", "--", sys.executable, "-c",
                       "import time; time.sleep(1)")
    assert p.returncode == 0, p.stderr
    assert "Cost: " in p.stderr and "at 3.06 per node-hour" in p.stderr
    findings = json.loads((run / "findings.json").read_text())
    assert findings["cost"]["price_per_hour"] == 3.06 and findings["cost"]["total"] > 0


def test_operator_time_per_profiled_step_is_compared(tmp_path):
    """Runs with detailed windows: `stallwatch compare` raised KeyError on the operators' column name."""
    from stallwatch.analyze.analysis import RunAnalysis

    from ..present.report._full_runs import full_run

    full_run(tmp_path / "a", nodes=("algo-1",), gpus=2)
    full_run(tmp_path / "b", nodes=("algo-1",), gpus=2)
    per_step = RunAnalysis(str(tmp_path / "a")).operators_per_step
    assert per_step and all(k.endswith("]") and v > 0 for k, v in per_step.items())
    doc = RunAnalysis(str(tmp_path / "b"), baseline=RunAnalysis(str(tmp_path / "a"))).comparison.to_json()
    assert doc["operators_us_per_step"]
