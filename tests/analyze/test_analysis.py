"""The façade over real runs of `stallwatch run`: the job's fate in the node record, the terminal, the report's
top and findings.json — a crashed, killed or stopped job never reads as healthy, and one that died before its
first step says exactly that; a healthy one says it is healthy, with its evidence."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.rules.builtin import RULES
from stallwatch.present.notebook import findings as notebook_findings
from tests.collect._support import stallwatch

LOOP = '''
import os, signal, sys, time, torch
torch.manual_seed(0)
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
data = torch.utils.data.DataLoader(torch.randn(160, 8), batch_size=4)  # in memory: fetching costs next to nothing
for i, xb in enumerate(data):
    time.sleep(0.005)  # the model's work (a real model takes milliseconds per step)
    opt.zero_grad(); m(xb).sum().backward(); opt.step()
    if i == {stop_at}:
        {how}
print("done", flush=True)
'''


def _run(tmp_path: Path, how: str, stop_at: int = 20) -> tuple[Path, object]:
    script = tmp_path / "job.py"
    script.write_text(LOOP.format(stop_at=stop_at, how=how))
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--out", str(run), "--rules-interval", "0", "--", sys.executable, str(script),
                   timeout=180)
    return run, p


def test_a_crashed_job_reads_as_crashed_everywhere(tmp_path: Path):
    run, p = _run(tmp_path, 'raise RuntimeError("planted crash")')
    assert p.returncode == 1
    record = json.loads((run / "nodes").glob("*.json").__next__().read_text())
    assert record["exit_code"] == 1 and record["exit_signal"] is None and record["interrupted"] is False
    doc = json.loads((run / "findings.json").read_text())
    assert doc["exit"]["code"] == 1 and doc["exit"]["state"] == "failed" and not doc["healthy"]
    assert doc["verdict"].startswith("The job failed with exit code 1 after") and "after 21 steps" in doc["verdict"]
    assert "What to fix first:\n  The job failed with exit code 1" in p.stderr
    html = (run / "report.html").read_text(encoding="utf-8")
    assert "The job failed with exit code 1" in html and "Healthy" not in html
    analysis = RunAnalysis(str(run))
    assert analysis.findings.verdict == doc["verdict"] == notebook_findings(str(run)).verdict  # one source


def test_a_killed_job_names_the_signal(tmp_path: Path):
    run, p = _run(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    assert p.returncode == 128 + signal.SIGKILL
    assert "command exit code 137 (SIGKILL)" in p.stderr
    summary = RunAnalysis(str(run)).summary
    assert summary.fate.state == "killed" and summary.fate.signal == "SIGKILL"
    assert RunAnalysis(str(run)).findings.verdict.startswith("The job was killed by SIGKILL (exit code 137)")


def test_a_job_that_dies_before_its_first_step(tmp_path: Path):
    script = tmp_path / "job.py"
    script.write_text("import sys, torch\nsys.exit(3)\n")
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--out", str(run), "--", sys.executable, str(script), timeout=120)
    assert p.returncode == 3
    verdict = json.loads((run / "findings.json").read_text())["verdict"]
    assert verdict.startswith("The job failed with exit code 3 after") and "before its first step" in verdict
    # it was profiled: no part of the report (nor the terminal's rules table) asks whether it was run under
    # `stallwatch run`; each says the job failed before its first step, with its exit code
    html = (run / "report.html").read_text(encoding="utf-8")
    assert "was it run under" not in html and "was it run under" not in p.stderr
    assert "Steps are recorded when a PyTorch job runs under" not in html
    assert "No framework metrics in this run: the job failed with exit code 3 after" in html
    assert "no framework data: the job failed with exit code 3 after" in p.stderr
    from stallwatch.present.report.sections import dataloading
    [section] = dataloading.build(RunAnalysis(str(run)))
    assert "No step was recorded: the job failed with exit code 3 after" in section.blocks[0].reason


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("healthy")
    run, p = _run(tmp, "pass", stop_at=-1)
    assert p.returncode == 0, p.stderr
    return run


def test_a_healthy_run_says_so_with_evidence(healthy: Path):
    f = RunAnalysis(str(healthy)).findings
    assert f.healthy and f.findings == [] and f.verdict.startswith("Healthy: no rule found a problem (")
    assert any("steps checked" in e for e in f.evidence)


def test_stored_results_are_read_back_typed(healthy: Path):
    analysis = RunAnalysis(str(healthy))
    stored = analysis.stored_rule_results()
    assert stored is not None and set(stored) >= {"StepOutlier", "OverallFrameworkMetrics"}
    assert [r.name for r in analysis.rule_results] == [rule.name for rule in RULES]  # in the report's order
    assert analysis.rule("StepOutlier").datapoints == 40


def test_summary_of_the_run(healthy: Path):
    s = RunAnalysis(str(healthy)).summary
    assert s.steps == {"TRAIN": 40} and s.fate.ok and s.loop is not None and s.total_steps == 40
    assert s.sample_interval_ms and all(v == 500 for v in s.sample_interval_ms.values())
    parts = s.parts_s()
    assert parts is not None and abs(sum(parts.values()) - s.duration_s) < 1e-6
