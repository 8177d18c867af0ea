"""The command line as scripts and users expect it: --version and `python -m stallwatch`, one JSON document on
stdout with --json (nothing else there), `ls` of a folder of runs, documented exit codes, and shell
completion generated from the parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stallwatch
from tests.run_builder import make_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of two finished runs (system data only) and one directory that is not a run."""
    root = tmp_path_factory.mktemp("runs")
    make_run(root / "20251122-054000-aaaaaa", nodes=("algo-1",))
    make_run(root / "20251122-064000-bbbbbb", nodes=("algo-1", "algo-2"), t0=1_763_790_000_000_000 + 3_600_000_000)
    (root / "notes").mkdir()
    return root


def test_version_and_module(run_stallwatch):
    want = f"stallwatch {stallwatch.__version__}"
    assert run_stallwatch("--version").stdout.strip() == want
    p = subprocess.run([sys.executable, "-m", "stallwatch", "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == want


@pytest.mark.parametrize("command, schema", [("info", "stallwatch.info/1"), ("summary", "stallwatch.summary/1"),
                                             ("rules", "stallwatch.rules/1")])
def test_json_is_one_document_on_stdout(run_stallwatch, runs: Path, command: str, schema: str):
    run = runs / "20251122-064000-bbbbbb"
    p = run_stallwatch(command, str(run), "--json", timeout=240)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # the whole of stdout is one document
    assert doc["schema"] == schema and doc["stallwatch_version"] == stallwatch.__version__
    if command == "info":
        assert [n["name"] for n in doc["nodes"]] == ["algo-1", "algo-2"] and doc["exit"]["state"] == "succeeded"
    elif command == "summary":
        assert doc["findings"]["verdict"] and set(doc["usage"]) == {"algo-1", "algo-2"}
    else:
        assert {r["RuleName"] for r in doc["results"]} >= {"StepOutlier", "OverallSystemUsage"}


def test_ls_newest_first_from_the_records(run_stallwatch, runs: Path):
    p = run_stallwatch("ls", str(runs))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:4] == ["run", "status", "start", "duration"]
    assert [line.split()[0] for line in lines[2:]] == ["20251122-064000-bbbbbb", "20251122-054000-aaaaaa"]
    assert "succeeded (0)" in lines[2] and "algo-1,algo-2" in lines[2]
    doc = json.loads(run_stallwatch("ls", str(runs), "--json").stdout)
    assert [r["id"] for r in doc["runs"]] == ["20251122-064000-bbbbbb", "20251122-054000-aaaaaa"]
    assert doc["runs"][0]["duration_s"] == pytest.approx(30.0, abs=1.5)


def test_exit_codes(run_stallwatch, runs: Path, tmp_path: Path):
    assert run_stallwatch("info", str(tmp_path / "nowhere")).returncode == 2  # not a run: an input error
    assert run_stallwatch("info").returncode == 2  # a usage error
    assert run_stallwatch("summary", str(runs / "20251122-054000-aaaaaa"), "--node", "nope").returncode == 2
    run = runs / "20251122-054000-aaaaaa"
    assert run_stallwatch("summary", str(run), "--fail-on", "any").returncode == 0  # nothing found
    assert run_stallwatch("ls", str(tmp_path)).returncode == 0


def test_fail_on_findings(run_stallwatch, tmp_path_factory: pytest.TempPathFactory):
    """The generated GPU run has planted problems: --fail-on any exits 1; a severity above its worst finding
    exits 0."""
    from tests.present.report.sections._runs import built

    analysis = built("gpu", tmp_path_factory)
    found = analysis.findings.findings
    assert found, "the generated run has planted problems"
    worst = found[0].severity
    p = run_stallwatch("summary", analysis.run.uri, "--fail-on", "any", "-q", timeout=240)
    assert p.returncode == 1, p.stderr
    order = ["low", "medium", "high"]
    above = [s for s in order if order.index(s) > order.index(worst)]
    if above:
        assert run_stallwatch("summary", analysis.run.uri, "--fail-on", above[0], timeout=240).returncode == 0


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(run_stallwatch, shell: str):
    p = run_stallwatch("completion", shell)
    assert p.returncode == 0 and "stallwatch" in p.stdout and "_ARGCOMPLETE" in p.stdout


def test_completion_answers_from_the_parser(tmp_path: Path):
    out = tmp_path / "completions"
    line = "stallwatch su"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out), "_ARGCOMPLETE_IFS": "\n"}
    subprocess.run([sys.executable, "-m", "stallwatch"], env=env, capture_output=True, timeout=60)
    assert out.read_text().split("\n")[0].strip() == "summary"
