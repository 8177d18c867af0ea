"""Changing a running job's profiling windows: `stallwatch config RUN ...` or an edit of the run's
config.json takes effect at a step boundary within ~2 s; an invalid edit is refused and changes nothing."""

from __future__ import annotations

import json
import sys

from stallwatch.store.reader import open_run

from ..collect._support import Background, wait_until
from ..collect._support import stallwatch as run_cli

# ~50 ms steps; after step 10 the job waits until the test says "go", so the changes land at a known step.
SCRIPT = '''
import os, sys, time
import torch
from torch.utils.data import DataLoader
here = sys.argv[1]
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(torch.randn(90 * 4, 8), batch_size=4)
for i, xb in enumerate(loader):
    if i == 10:
        open(os.path.join(here, "ready"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(here, "go")) and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(0.05)
    opt.zero_grad(); model(xb).sum().backward(); opt.step()
'''


def test_live_changes_apply_and_an_invalid_edit_is_refused(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    run = tmp_path / "run"
    job = Background(tmp_path, "run", "--report", "off", "--out", str(run), "--flush-interval", "1", "--",
                     sys.executable, str(script), str(tmp_path))
    try:
        wait_until(lambda: (tmp_path / "ready").exists(), 60, what="the job to reach step 10")
        p = run_cli(tmp_path, "config", str(run), "--detailed-profiling", "60:2")
        assert p.returncode == 0, p.stderr
        config = json.loads((run / "config.json").read_text())
        config["python_profiling"] = "65:1"  # an edit of the file itself
        (run / "config.json").write_text(json.dumps(config))
        wait_until(lambda: "python_profiling=65:1" in job.stderr, 10, what="the change to be taken")
        (run / "config.json").write_text('{"detailed_profiling": "sixty"}')
        wait_until(lambda: "refused" in job.stderr, 10, what="the invalid edit to be refused")
        (tmp_path / "go").touch()
        assert job.wait(120) == 0, job.stderr
    finally:
        job.kill_all()
    assert "change is refused" in job.stderr and "detailed_profiling" in job.stderr
    windows = {w["layer"]: w for w in open_run(str(run)).profiles()}
    assert (windows["detailed"]["first_step"], windows["detailed"]["last_step"]) == (60, 61)
    assert (windows["python"]["first_step"], windows["python"]["last_step"]) == (65, 65)


def test_a_window_already_past_is_said_so(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    run = tmp_path / "run"
    job = Background(tmp_path, "run", "--report", "off",
                     "--out", str(run), "--", sys.executable, str(script), str(tmp_path))
    try:
        wait_until(lambda: (tmp_path / "ready").exists(), 60, what="the job to reach step 10")
        assert run_cli(tmp_path, "config", str(run), "--detailed-profiling", "2:3").returncode == 0
        wait_until(lambda: "live configuration changed" in job.stderr, 10, what="the change to be taken")
        (tmp_path / "go").touch()
        assert job.wait(120) == 0, job.stderr
    finally:
        job.kill_all()
    assert "already past" in job.stderr
    assert open_run(str(run)).profiles() == []


def test_a_600_kb_stop_training_reason_stops_the_job_with_the_reason_cut_and_said(tmp_path):
    """A stop_training reason of 600 KB written into config.json: the job stops at its next step, and the
    reason it records is the first 4,000 characters with a note of the length. Before, the message was larger
    than the socket's room, its partial send was ignored, and the job ran all its steps."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.replace("90 * 4", "400 * 4"))
    run = tmp_path / "run"
    job = Background(tmp_path, "run", "--report", "off", "--out", str(run), "--flush-interval", "1", "--",
                     sys.executable, str(script), str(tmp_path))
    try:
        wait_until(lambda: (tmp_path / "ready").exists(), 60, what="the job to reach step 10")
        config = json.loads((run / "config.json").read_text())
        config["stop_training"] = "slow " + "x" * 600_000
        (run / "config.json").write_text(json.dumps(config))
        wait_until(lambda: "stop_training" in job.stderr, 10, what="the change to be taken")
        (tmp_path / "go").touch()
        assert job.wait(120) == 0, job.stderr
    finally:
        job.kill_all()
    (stop,) = open_run(str(run)).framework(kinds=["stop"]).to_pylist()
    args = json.loads(stop["args"])
    assert args["reason"].startswith("slow xxx") and args["reason"].endswith("(cut to 4000 of its 600005 characters)")
    assert args["train_steps"] < 100, args  # stopped within a few steps of the change, not after all 400
