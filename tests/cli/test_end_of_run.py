"""The end of `stallwatch run` reads the run through ONE analysis: the summary, the cost, the findings and the
report share it and the rules' last evaluation (they built up to three, and the summary's cost evaluated the
rules again). A real run (a real job under `stallwatch run --report off`), then the end of run in-process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.judge.by_node import evaluate_run
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.cli import end_of_run
from stallwatch.collect import report_timing
from stallwatch.collect.launcher import LaunchResult
from stallwatch.config import ProfilerConfig
from stallwatch.store.reader import open_run
from tests.collect._support import stallwatch

JOB = "import time\nfor _ in range(20):\n    time.sleep(0.05)\nprint('done')\n"


class _Rules:
    """The live rules' last evaluation, as LiveRules.finish gives it: evaluated once, here."""

    def __init__(self) -> None:
        self.finished = 0

    def finish(self, uri: str) -> list:
        self.finished += 1
        return evaluate_run(open_run(uri), builtin_rules(), {})


def test_one_analysis_for_the_summary_the_findings_and_the_report(tmp_path: Path, monkeypatch, capsys):
    (tmp_path / "job.py").write_text(JOB)
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off", "--price-per-hour", "2", "--out", str(run), "--",
                   sys.executable, str(tmp_path / "job.py"), timeout=120)
    assert p.returncode == 0, p.stderr
    node = json.loads(next((run / "nodes").glob("*.json")).read_text())
    made, evaluated = [], []
    real_init, real_evaluate = RunAnalysis.__init__, RunAnalysis.evaluate_rules
    monkeypatch.setattr(RunAnalysis, "__init__", lambda self, *a, **k: (made.append(a), real_init(self, *a, **k))[1])
    monkeypatch.setattr(RunAnalysis, "evaluate_rules",
                        lambda self, *a, **k: (evaluated.append(a), real_evaluate(self, *a, **k))[1])
    result = LaunchResult(run_uri=str(run), node=node["node"], exit_code=0, start_us=node["start_us"],
                          end_us=node["end_us"])
    rules = _Rules()
    end_of_run.finish(result, ProfilerConfig(price_per_hour=2.0), rules, report=report_timing.WAIT, as_json=False)
    err = capsys.readouterr().err
    assert len(made) == 1 and not evaluated and rules.finished == 1, err
    assert "summary unavailable" not in err and "could not" not in err, err
    assert "What to fix first" in err and err.rstrip().splitlines()[-1] == f"stallwatch: report {run / 'report.html'}"
    assert (run / "findings.json").is_file() and (run / "report.html").is_file()
    assert json.loads((run / "findings.json").read_text())["cost"] is not None  # the price reached the cost


def test_the_json_summary_shares_the_analysis_too(tmp_path: Path, monkeypatch, capsys):
    (tmp_path / "job.py").write_text(JOB)
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off", "--out", str(run), "--", sys.executable,
                   str(tmp_path / "job.py"), timeout=120)
    assert p.returncode == 0, p.stderr
    node = json.loads(next((run / "nodes").glob("*.json")).read_text())
    made = []
    real_init = RunAnalysis.__init__
    monkeypatch.setattr(RunAnalysis, "__init__", lambda self, *a, **k: (made.append(a), real_init(self, *a, **k))[1])
    result = LaunchResult(run_uri=str(run), node=node["node"], exit_code=0, start_us=node["start_us"],
                          end_us=node["end_us"])
    end_of_run.finish(result, ProfilerConfig(), _Rules(), report=report_timing.WAIT, as_json=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(made) == 1
    document = json.loads("\n".join(err[:-1]))
    assert document["schema"].startswith("stallwatch.summary") and "error" not in document
    assert err[-1] == f"stallwatch: report {run / 'report.html'}"


def test_live_rules_on_a_store_that_overruns_the_upload_timeout_are_left_with_a_line(tmp_path: Path, monkeypatch,
                                                                                     capsys):
    """The live rules' last pass over a run on S3 still going when --upload-timeout has passed: LiveRules.finish
    says so at the timeout (it waited 120 s), and the end of run reads nothing more from the store (the findings
    would have evaluated every rule over it again), naming the commands that give them later."""
    import threading
    import time

    from stallwatch.analyze.judge.during_run import LiveRules, RulesNotFinished

    live = LiveRules(ProfilerConfig(out="s3://bucket/runs/r", upload_timeout_s=0.5, rules_interval_s=0))
    live._thread = threading.Thread(target=time.sleep, args=(5,), daemon=True)  # a pass stuck on the store
    live._thread.start()
    try:
        live.finish("s3://bucket/runs/r")
        raise AssertionError("no RulesNotFinished")
    except RulesNotFinished as exc:
        assert "--upload-timeout 0.5 s" in str(exc) and "stallwatch rules s3://bucket/runs/r" in str(exc)
    assert live._thread.is_alive()  # left at the user's timeout, not waited for to its end

    (tmp_path / "job.py").write_text(JOB)
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off", "--out", str(run), "--", sys.executable,
                   str(tmp_path / "job.py"), timeout=120)
    assert p.returncode == 0, p.stderr
    node = json.loads(next((run / "nodes").glob("*.json")).read_text())
    evaluated = []
    monkeypatch.setattr(RunAnalysis, "evaluate_rules", lambda self, *a, **k: evaluated.append(a) or [])

    class _Slow:
        def finish(self, uri: str) -> list:
            raise RulesNotFinished("the rules' last evaluation did not finish within --upload-timeout 5 s")

    result = LaunchResult(run_uri=str(run), node=node["node"], exit_code=0, start_us=node["start_us"],
                          end_us=node["end_us"])
    end_of_run.finish(result, ProfilerConfig(), _Slow(), report=report_timing.WAIT, as_json=False)
    err = capsys.readouterr().err
    assert not evaluated and "What to fix first" not in err and not (run / "report.html").exists(), err
    assert err.rstrip().splitlines()[-1].endswith(f"`stallwatch summary {run}` and `stallwatch report {run}` give "
                                                  "the findings and the report"), err
