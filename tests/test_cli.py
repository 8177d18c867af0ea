"""The command line's own handling of what it is given: rules named by flags are checked before a job starts,
names read from a run never choose where a file goes, a copy never leaves the run directory, and an
unreachable store is one line, not a traceback."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.store.s3_server import closed_port, s3_environment

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
], ids=["missing-file", "missing-module", "unknown-rule"])
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

