"""The command line as scripts and users expect it: --version and `python -m stallwatch`, one JSON document on
stdout with --json (nothing else there), `ls` of a folder of runs, documented exit codes, and shell
completion generated from the parser.
Its handling of what it is given: rules named by flags are checked before a job starts, names read from a run
never choose where a file goes, a copy never leaves the run directory, and an unreachable store is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stallwatch
from tests.run_builder import make_run
from tests.store.s3_server import closed_port, s3_environment


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


@pytest.mark.parametrize("command, schema", [("info", "stallwatch.info/1"), ("summary", "stallwatch.summary/2"),
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


def test_a_copied_run_is_listed_by_the_folder_that_opens_it_with_its_recorded_id_beside(run_stallwatch, runs: Path,
                                                                                        tmp_path: Path):
    """A run copied to another folder was listed under the id in its run.json, which opens nothing."""
    import shutil

    shutil.copytree(runs / "20251122-054000-aaaaaa", tmp_path / "copied" / "baseline")
    doc = json.loads(run_stallwatch("ls", str(tmp_path / "copied"), "--json").stdout)
    assert [(r["id"], r["run_id"]) for r in doc["runs"]] == [("baseline", "20251122-054000-aaaaaa")]
    text = run_stallwatch("ls", str(tmp_path / "copied")).stdout
    assert "baseline (id 20251122-054000-aaaaaa)" in text
    assert run_stallwatch("info", str(tmp_path / "copied" / "baseline")).returncode == 0


def test_exit_codes(run_stallwatch, runs: Path, tmp_path: Path):
    assert run_stallwatch("info", str(tmp_path / "nowhere")).returncode == 2  # not a run: an input error
    assert run_stallwatch("info").returncode == 2  # a usage error
    assert run_stallwatch("summary", str(runs / "20251122-054000-aaaaaa"), "--node", "nope").returncode == 2
    run = runs / "20251122-054000-aaaaaa"
    p = run_stallwatch("summary", str(run), "--fail-on", "any")
    assert p.returncode == 0  # nothing found
    # the report's path, as `stallwatch run` ends (or the command that writes it)
    assert f"stallwatch: no report yet: `stallwatch report {run}` writes it" in p.stderr
    (run / "report.html").write_text("<html></html>")
    p = run_stallwatch("summary", str(run))
    assert f"stallwatch: report {run / 'report.html'}" in p.stderr
    (run / "report.html").unlink()
    assert run_stallwatch("ls", str(tmp_path)).returncode == 0


def test_rules_again_rewrite_the_findings_and_say_the_report_is_stale(run_stallwatch, tmp_path: Path):
    """`stallwatch rules RUN --param …` rewrote rules/*.json while findings.json (which `ls`, `summary` and the
    dashboard read) and report.html kept the earlier story, without a word."""
    run = tmp_path / "run"
    make_run(run, nodes=("algo-1",))
    (run / "findings.json").write_text('{"verdict": "the earlier story"}')
    (run / "report.html").write_text("<html>the earlier story</html>")
    p = run_stallwatch("rules", str(run), "--param", "MaxInitializationTime.threshold=0.02")
    assert p.returncode == 0, p.stderr
    assert json.loads((run / "findings.json").read_text())["verdict"] != "the earlier story"
    assert "report.html still show the earlier evaluation" in p.stderr and f"stallwatch report {run}" in p.stderr
    # a subset of the rules rewrites nothing else, and says so
    p = run_stallwatch("rules", str(run), "--rule", "OverallSystemUsage")
    assert "findings.json and report.html still show the earlier evaluation" in p.stderr


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


RULE_FILE = '''
from stallwatch.analyze.rules import Rule

class CountSnapshots(Rule):
    name = "CountSnapshots"
    description = "Counts snapshots."
    recommendation = "None."

    def __init__(self, **params):
        super().__init__(**params)
        self.seen = 0

    def update(self, chunk):
        self.seen += sum(len(f) for f in chunk.system.values())

    def result(self):
        return self.make_result(triggered=0, violations=0, datapoints=self.seen)
'''


def _job(tmp_path: Path) -> list[str]:
    """A command that leaves a mark when it runs."""
    return [sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w').close()"]


# -- rules named on the command line --------------------------------------------------------------------------

@pytest.mark.parametrize("flags, field, words", [
    (["--custom-rule", "no_such_file.py:Busy"], "custom_rules", "cannot be loaded"),
    (["--custom-rule", "no_such_module_here:Busy"], "custom_rules", "cannot be loaded"),
    (["--rule-action", "NoSuchRule=log"], "rule_actions", "there is no rule named 'NoSuchRule'"),
    (["--param", "NoSuchRule.x=1"], "rule_params", "no rule named 'NoSuchRule'"),
    (["--param", "StepOutlier.nope=1"], "rule_params", "StepOutlier has no parameter 'nope'"),
    (["--param", "StepOutlier.stddev=lots"], "rule_params", "must be a number"),
    (["--param", "stddev=2"], "rule_params", "write RULE.parameter=value"),
], ids=["missing-file", "missing-module", "unknown-rule", "param-unknown-rule", "param-unknown-name", "param-type",
        "param-form"])
def test_a_bad_rule_flag_is_refused_before_the_job_starts(run_stallwatch, tmp_path, flags, field, words):
    """A bad --custom-rule made the run's every evaluation fail, built-in rules included, and said so only
    after the job; an unknown rule in --rule-action was accepted and never acted on."""
    run = tmp_path / "run"
    p = run_stallwatch("run", *flags, "--out", str(run), "--", *_job(tmp_path))
    assert p.returncode == 2, p.stderr
    assert not (tmp_path / "ran").exists() and not run.exists()
    (line,) = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert line.startswith(f"stallwatch run: invalid {field}=") and words in line, line
    if field == "rule_actions":
        assert "CPUBottleneck" in line  # what is allowed


def test_a_good_custom_rule_and_its_action_are_accepted(run_stallwatch, tmp_path):
    (tmp_path / "my_rules.py").write_text(RULE_FILE)
    run = tmp_path / "run"
    p = run_stallwatch("run", "--interval", "100ms", "--rules-interval", "0", "--custom-rule",
                       "my_rules.py:CountSnapshots", "--rule-action", "countsnapshots=log", "--out", str(run),
                       "--", sys.executable, "-c", "import time; time.sleep(0.5)")
    assert p.returncode == 0, p.stderr
    assert json.loads((run / "rules" / "CountSnapshots.json").read_text())["RuleName"] == "CountSnapshots"
    assert (run / "rules" / "CPUBottleneck.json").exists()


SLOW_START_JOB = """
import time, torch
time.sleep(1.5)  # a slow start-up: MaxInitializationTime fires at threshold=0.02 minutes, not at its default
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.utils.data.DataLoader(torch.randn(40, 4), batch_size=8):
    model(x).sum().backward(); opt.step(); opt.zero_grad()
"""


def test_rule_parameters_given_to_run_apply_at_the_end_and_summary_evaluates_again_with_its_own(run_stallwatch,
                                                                                                 tmp_path):
    """`--param` on `run` (a short run's verdict asks for it) reaches the rules; `summary` and `report` evaluate
    again with their own `--param`, and refuse a wrong one in one line."""
    run, job = tmp_path / "run", tmp_path / "job.py"
    job.write_text(SLOW_START_JOB)
    p = run_stallwatch("run", "--interval", "100ms", "--report", "off",
                       "--param", "maxinitializationtime.threshold=0.02", "--param", "StepOutlier.stddev=4.5", "--out", str(run), "--", sys.executable, str(job))
    assert p.returncode == 0, p.stderr

    def rule(name):
        return json.loads((run / "rules" / f"{name}.json").read_text())

    assert "threshold:0.02" in rule("MaxInitializationTime")["RuleParameters"]
    assert rule("MaxInitializationTime")["RuleTriggered"] == 1
    assert "stddev:4.5" in rule("StepOutlier")["RuleParameters"]
    assert "patience:1000" in rule("CPUBottleneck")["RuleParameters"]  # the others keep their defaults
    assert json.loads((run / "config.json").read_text())["rule_params"] == [
        "maxinitializationtime.threshold=0.02", "StepOutlier.stddev=4.5"]

    def found(*flags):
        s = run_stallwatch("summary", str(run), "--json", *flags)
        assert s.returncode == 0, s.stderr
        return {f["rule"] for f in json.loads(s.stdout)["findings"]["findings"]}

    assert "MaxInitializationTime" in found()  # the run's own results
    assert "MaxInitializationTime" not in found("--param", "MaxInitializationTime.threshold=5")
    bad = run_stallwatch("report", str(run), "--param", "StepOutlier.stddev=lots")
    assert bad.returncode == 2 and "StepOutlier.stddev='lots': must be a number" in bad.stderr, bad.stderr

    # `rules RUN` evaluates again with the run's own parameters (it took the defaults: a second story), each one
    # overridden by its own --param; every derived file follows (findings.json) or is said to be stale (report)
    (run / "report.html").write_text("<html>the earlier story</html>")
    (run / "rules" / "MaxInitializationTime.json").unlink()
    p = run_stallwatch("rules", str(run), "--param", "StepOutlier.stddev=3.5")
    assert p.returncode == 0, p.stderr
    assert "threshold:0.02" in rule("MaxInitializationTime")["RuleParameters"]
    assert rule("MaxInitializationTime")["RuleTriggered"] == 1
    assert "stddev:3.5" in rule("StepOutlier")["RuleParameters"]
    findings = json.loads((run / "findings.json").read_text())
    assert "MaxInitializationTime" in {f["rule"] for f in findings["findings"]}
    assert "report.html still show the earlier evaluation" in p.stderr
    assert "MaxInitializationTime" in found()
    # summary and report evaluating again (a --param of theirs) keep the run's other parameters
    s = run_stallwatch("summary", str(run), "--json", "--param", "StepOutlier.stddev=4")
    assert "MaxInitializationTime" in {f["rule"] for f in json.loads(s.stdout)["findings"]["findings"]}, s.stderr


def test_a_runs_bad_rule_parameters_are_said_and_left_out_when_evaluated_again(run_stallwatch, tmp_path: Path):
    """The run's config is data: a parameter in it that does not parse or names no rule is said once and left out;
    the rules are evaluated with the run's good ones."""
    run = tmp_path / "run"
    make_run(run, nodes=("algo-1",))
    cfg = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    cfg["rule_params"] = ["StepOutlier.stddev=lots", "NoSuchRule.x=1", "MaxInitializationTime.threshold=0.02"]
    (run / "config.json").write_text(json.dumps(cfg))
    p = run_stallwatch("rules", str(run))
    assert p.returncode == 0, p.stderr
    assert "StepOutlier.stddev='lots'" in p.stderr and "NoSuchRule" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    doc = json.loads((run / "rules" / "MaxInitializationTime.json").read_text())
    assert "threshold:0.02" in doc["RuleParameters"]
    assert "lots" not in json.loads((run / "rules" / "StepOutlier.json").read_text())["RuleParameters"]


def test_a_bad_custom_rule_in_a_config_file_leaves_the_built_in_rules_running(run_stallwatch, tmp_path):
    """A config file never stops a job: its bad custom rule is one line, the job and the built-in rules run."""
    cfg = tmp_path / "profiling.json"
    cfg.write_text(json.dumps({"custom_rules": ["no_such_file.py:Busy"]}))
    run = tmp_path / "run"
    p = run_stallwatch("run", "--config", str(cfg), "--interval", "100ms", "--rules-interval", "0", "--out",
                       str(run), "--", *_job(tmp_path))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "ran").exists()
    errors = [ln for ln in p.stderr.splitlines() if "invalid custom_rules" in ln]
    assert len(errors) == 1 and "default configuration" in errors[0], p.stderr
    assert "could not be evaluated" not in p.stderr
    assert (run / "rules" / "CPUBottleneck.json").exists()


# -- names from a run never choose a path ---------------------------------------------------------------------

@pytest.mark.parametrize("run_id", ["../../escaped", "/tmp/absolute", "..", ".hidden", "a/b", 7, ["x"]])
def test_the_timeline_is_written_under_a_plain_name_whatever_the_run_id(tmp_path, monkeypatch, capsys, run_id):
    """`stallwatch timeline RUN` names its file after the run id from run.json: '../../escaped' wrote it two
    directories up."""
    from stallwatch.cli import main

    run = tmp_path / "runs" / "crafted"
    (run / "nodes").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"format_version": 1, "run_id": run_id}))
    (run / "nodes" / "n.json").write_text(json.dumps({"node": "n", "start_us": 1_763_790_000_000_000}))
    cwd = tmp_path / "here" / "deeper"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    assert main(["timeline", str(run), "--no-profiler"]) == 0
    written = Path(capsys.readouterr().out.strip())
    assert written == Path("crafted-timeline.json.gz")
    assert (cwd / written).is_file()
    assert [p.name for p in tmp_path.rglob("*timeline*")] == ["crafted-timeline.json.gz"]


# -- upload copies the run, nothing else ---------------------------------------------------------------------

def test_upload_does_not_follow_links_out_of_the_run(run_stallwatch, tmp_path):
    """Symbolic links inside a run pointed `stallwatch upload` at any file the user can read (a key, a
    password file) and copied it into the bucket."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE KEY")
    src = tmp_path / "spool"
    (src / "nodes").mkdir(parents=True)
    (src / "nodes" / "n1.json").write_text('{"node": "n1"}')
    (src / "system" / "n1").mkdir(parents=True)
    os.symlink(secret / "id_rsa", src / "system" / "n1" / "leak.json")  # a file link
    os.symlink(secret, src / "framework")  # a directory link
    os.symlink(secret / "id_rsa", src / "run.json")
    dest = tmp_path / "dest"
    p = run_stallwatch("upload", str(src), str(dest))
    assert p.returncode == 0, p.stderr
    copied = sorted(str(f.relative_to(dest)) for f in dest.rglob("*") if f.is_file())
    assert copied == ["nodes/n1.json"], copied
    assert "PRIVATE KEY" not in "".join(f.read_text() for f in dest.rglob("*") if f.is_file())
    assert "symbolic link" in p.stderr, p.stderr


# -- an unreachable store -------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["info"], ["rules"], ["report"], ["timeline"], ["config"],
                                     ["config", "--detailed-profiling", "5:1"]])
def test_an_unreachable_s3_endpoint_is_one_line(run_stallwatch, tmp_path, command):
    env = s3_environment(f"http://127.0.0.1:{closed_port()}", tmp_path / "cache")
    p = run_stallwatch(command[0], "s3://bkt/runs/run-7", *command[1:], env=env, timeout=120)
    assert p.returncode in (1, 2), p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"stallwatch {command[0]}: "), p.stderr
    assert "s3://bkt/runs/run-7" in lines[0] and "connect" in lines[0].lower(), lines[0]



def test_the_report_can_be_left_to_a_detached_process_or_skipped(run_stallwatch, tmp_path):
    """`--report background` returns the job's status without waiting for the report, which a detached
    `stallwatch report` writes from the stored rule results; `--report off` writes none."""
    off = tmp_path / "off"
    p = run_stallwatch("run", "--report", "off", "--out", str(off), "--", *_job(tmp_path))
    assert p.returncode == 0 and (off / "findings.json").exists() and not (off / "report.html").exists()
    bg = tmp_path / "bg"
    p = run_stallwatch("run", "--report", "background", "--out", str(bg), "--", sys.executable, "-c",
                       "import sys; sys.exit(3)")
    assert p.returncode == 3
    assert f"report {bg / 'report.html'} (being written in the background" in p.stderr
    assert (bg / "report.html").exists()  # the page that reloads itself, or already the report
    _wait_for_the_report(bg)


def _wait_for_the_report(run: Path) -> None:
    import time

    deadline = time.monotonic() + 120
    while "being written" in (text := (run / "report.html").read_text())[:2000] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "<title>stallwatch profiling report</title>" in text[:3000]


def test_at_a_terminal_the_default_follows_where_a_detached_process_survives(tmp_path):
    """`--report auto` (the default) with stallwatch's output on a real terminal (a pty): where nothing ends a
    detached process with the command (judged here as the command will judge it), the job's status comes back
    with the report still being written; in a container started for the job, or a scheduler's job, the
    report is there when the command returns. The job's own exit status either way."""
    import pty
    import threading

    from stallwatch.collect.report_timing import AUTO, BACKGROUND, choose

    expected = choose(AUTO, interactive=True).mode
    out = tmp_path / "run"
    primary, secondary = pty.openpty()
    seen: list[bytes] = []
    reader = threading.Thread(target=lambda: _drain(primary, seen), daemon=True)
    reader.start()
    try:
        p = subprocess.run([sys.executable, "-m", "stallwatch", "run", "--out", str(out), "--", sys.executable,
                            "-c", "import sys; sys.exit(5)"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=secondary, timeout=180)
    finally:
        os.close(secondary)
        reader.join(10)
        os.close(primary)
    terminal = b"".join(seen).decode(errors="replace")
    assert p.returncode == 5, terminal
    assert (out / "report.html").exists(), terminal
    if expected == BACKGROUND:
        assert "being written in the background" in terminal, terminal
        _wait_for_the_report(out)
    else:
        assert "being written" not in terminal, terminal
        assert "being written" not in (out / "report.html").read_text()[:2000]


def test_a_terminal_is_told_from_a_pipe_and_a_closed_stream(monkeypatch):
    """What `--report auto` asks first: is stallwatch's own output (stderr) a terminal? A real pty is, a pipe is
    not, and a closed or missing stderr is not (never an exception)."""
    import pty

    from stallwatch.cli import run as cli

    primary, secondary = pty.openpty()
    read_end, write_end = os.pipe()
    try:
        with open(secondary, "w", closefd=False) as tty, open(write_end, "w", closefd=False) as pipe:
            monkeypatch.setattr(sys, "stderr", tty)
            assert cli.at_a_terminal()
            monkeypatch.setattr(sys, "stderr", pipe)
            assert not cli.at_a_terminal()
        closed = open(os.devnull, "w")
        closed.close()
        monkeypatch.setattr(sys, "stderr", closed)
        assert not cli.at_a_terminal()
        monkeypatch.setattr(sys, "stderr", None)
        assert not cli.at_a_terminal()
    finally:
        for fd in (primary, secondary, read_end, write_end):
            os.close(fd)


def _drain(fd: int, into: list[bytes]) -> None:
    """Read a pty until it closes (a full pty would block the writer)."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        into.append(chunk)
