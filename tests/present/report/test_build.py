"""build_report and its command line: where the report goes (the run, a file, S3), that it is written
atomically, that a broken section costs only itself, that the rules' results are taken as given or read back
from the run rather than evaluated again, and that `stallwatch run` ends with the report."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.judge.feed import read_run
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.analyze.judge.runner import evaluate, write_results
from stallwatch.present.report import build_report, build_sections
from stallwatch.present.report.model import NotApplicable
from stallwatch.present.report.sections import section_modules
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run
from stallwatch.store.transfer import copy_run

from ._full_runs import Planted, full_run
from .test_html import _parse

MINE = ("summary", "system-usage", "framework", "cpu-operators", "gpu-operators", "rules")
PLANTED = "planted recommendation, only in the results handed over"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    return full_run(tmp_path_factory.mktemp("build") / "run", gpus=1)


@pytest.fixture
def run_copy(small_run: Planted, tmp_path: Path) -> Path:
    """A private copy (tests here write into the run)."""
    return Path(shutil.copytree(small_run.root, tmp_path / "run"))


def _results(root: Path) -> list:
    run = open_run(str(root))
    return evaluate(builtin_rules(), [read_run(run, builtin_rules())])


def _no_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the report evaluated the rules again")
    monkeypatch.setattr(RunAnalysis, "evaluate_rules", refuse)


def test_the_report_goes_into_the_run_atomically(run_copy: Path):
    where = build_report(str(run_copy))
    assert where == str(run_copy / "report.html")
    text = (run_copy / "report.html").read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    for sid in MINE:
        assert f'<section id="{sid}">' in text
    assert not [p for p in run_copy.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert build_report(open_run(str(run_copy))) == where  # a Run works as well as its path; replaced in place


def test_the_whole_report_references_nothing_outside_itself(run_copy: Path):
    text = Path(build_report(str(run_copy))).read_text(encoding="utf-8")
    urls = _parse(text).urls
    assert urls and all(u.startswith("#") for u in urls), [u for u in urls if not u.startswith("#")]
    assert "<link" not in text and not re.search(r"<script[^>]*\bsrc=", text)


def test_out_writes_anywhere_and_leaves_the_run_alone(run_copy: Path, tmp_path: Path):
    target = tmp_path / "somewhere" / "new" / "r.html"
    assert build_report(str(run_copy), target) == str(target)
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert not (run_copy / "report.html").exists()


def test_a_broken_section_costs_only_itself(run_copy: Path, monkeypatch: pytest.MonkeyPatch, caplog):
    (summary,) = [m for m in section_modules() if m.__name__.endswith(".summary")]

    def broken(ctx):
        raise ZeroDivisionError("planted failure")
    monkeypatch.setattr(summary, "build", broken)
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        sections = build_sections(RunAnalysis(open_run(str(run_copy))))
    first = next(s for s in sections if s.id == "summary")
    assert first.title == "Training job summary"
    assert isinstance(first.blocks[0], NotApplicable) and "ZeroDivisionError: planted failure" in first.blocks[0].reason
    ids = [s.id for s in sections]
    assert ids[ids.index("summary") + 1:ids.index("summary") + len(MINE)] == list(MINE[1:])  # the others are all there
    lines = [r for r in caplog.records if "summary section failed" in r.getMessage()]
    assert len(lines) == 1
    text = Path(build_report(str(run_copy))).read_text(encoding="utf-8")
    assert "planted failure" in text and '<section id="rules">' in text


def test_rule_results_handed_over_are_used_as_they_are(run_copy: Path, monkeypatch: pytest.MonkeyPatch):
    results = _results(run_copy)
    for r in results:
        if r.name == "CPUBottleneck":
            r.recommendation = PLANTED
    _no_evaluation(monkeypatch)
    text = Path(build_report(str(run_copy), rule_results=results)).read_text(encoding="utf-8")
    assert PLANTED in text


def test_results_stored_in_a_finished_run_are_read_back_not_evaluated(run_copy: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    write_results(RunLocation(str(run_copy)), _results(run_copy))
    path = run_copy / "rules" / "CPUBottleneck.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "Recommendation": PLANTED}))
    _no_evaluation(monkeypatch)
    assert PLANTED in Path(build_report(str(run_copy))).read_text(encoding="utf-8")


def test_a_run_on_s3_gets_its_report_on_s3(small_run: Planted, s3_server, s3_env, bucket):
    uri = f"s3://{bucket}/runs/run-1"
    copy_run(RunLocation(str(small_run.root)), RunLocation(uri))
    assert build_report(uri) == f"{uri}/report.html"
    body = s3_server.get(bucket, "runs/run-1/report.html").decode("utf-8")
    assert body.startswith("<!DOCTYPE html>") and '<section id="rules">' in body


def test_cli_report(run_copy: Path, tmp_path: Path, run_stallwatch):
    p = run_stallwatch("report", str(run_copy))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(run_copy / "report.html") and (run_copy / "report.html").is_file()
    p = run_stallwatch("report", str(run_copy), "-o", str(tmp_path / "out.html"))
    assert p.returncode == 0 and p.stdout.strip() == str(tmp_path / "out.html")
    assert '<section id="rules">' in (tmp_path / "out.html").read_text(encoding="utf-8")
    p = run_stallwatch("report", str(tmp_path / "not-a-run"))
    assert p.returncode == 2 and "is not a stallwatch run" in p.stderr and p.stdout == ""


JOB = '''
import torch
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
for xb in torch.utils.data.DataLoader(torch.randn(80, 8), batch_size=4):
    opt.zero_grad(); m(xb).sum().backward(); opt.step()
print("trained", flush=True)
'''


def test_stallwatch_run_ends_with_the_report(tmp_path: Path, run_stallwatch):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run = tmp_path / "run"
    p = run_stallwatch("run", "--out", str(run), "--", sys.executable, str(script), timeout=240)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "trained\n"  # the job's stdout stays the job's
    assert p.stderr.rstrip().splitlines()[-1] == f"stallwatch: report {run / 'report.html'}"
    text = (run / "report.html").read_text(encoding="utf-8")
    assert "Training job summary" in text and "Steps (all ranks)</td><td>20 TRAIN</td>" in text  # 80 samples / 4


def test_a_report_that_cannot_be_written_is_one_line_not_a_failure(tmp_path: Path, run_stallwatch):
    """No Bokeh (a package that refuses to import stands in for it): the job's exit code, and one line."""
    fake = tmp_path / "site" / "bokeh"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'bokeh'\", name='bokeh')\n")
    script = tmp_path / "job.py"
    script.write_text("import sys; print('done'); sys.exit(3)\n")
    run = tmp_path / "run"
    p = run_stallwatch("run", "--out", str(run), "--", sys.executable, str(script),
                       env={"PYTHONPATH": f"{tmp_path / 'site'}"}, timeout=120)
    assert p.returncode == 3, p.stderr
    last = p.stderr.rstrip().splitlines()[-1]
    assert last.startswith("stallwatch: no report: bokeh is not installed") and f"stallwatch report {run}" in last
    assert not (run / "report.html").exists()
