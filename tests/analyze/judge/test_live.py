"""Live evaluation: data handed out exactly once as it appears in the store, and a run followed while it
grows ends with the same results as a batch evaluation of the finished run."""

from __future__ import annotations

import json
import sys

from stallwatch.analyze.judge.feed import read_run
from stallwatch.analyze.judge.live import LiveEvaluation, LiveFeed
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.records import FrameworkEvent
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import RunNotFoundError, open_run

from ...collect._support import Background, wait_until
from ...collect._support import stallwatch as run_cli
from ...run_builder import make_run


def test_events_are_handed_out_once_even_when_they_arrive_late(tmp_path):
    make_run(tmp_path / "run", nodes=("n1",))
    location = RunLocation(str(tmp_path / "run"))
    writer = FrameworkWriter(location, "n1", 0, flush_interval_us=1, max_bytes=1 << 30)
    t0 = 1_763_790_000_000_000
    feed = LiveFeed(open_run(str(tmp_path / "run")))
    seen = []

    def write(steps):
        for i in steps:
            writer.append(FrameworkEvent("step", "train_step", t0 + i * 1000, t0 + i * 1000 + 900, "TRAIN", i, 1, ""))
        writer.tick(t0 + 10**9)  # flush

    write(range(0, 10))
    seen += feed.next().framework["step"].to_pylist()
    write([12, 13, 10, 11])  # 10 and 11 arrive after later steps
    seen += feed.next().framework["step"].to_pylist()
    seen += feed.next().framework["step"].to_pylist()  # nothing new
    writer.close()
    seen += feed.next(final=True).framework["step"].to_pylist()
    assert sorted(seen) == list(range(14))


def _has_events(run) -> bool:
    """The run has framework events; False while it is not yet a run (`nodes/` made, its first record not yet)."""
    try:
        return open_run(str(run)).framework().num_rows > 0
    except RunNotFoundError:
        return False


def test_a_followed_run_ends_with_the_batch_result(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import sys, time, torch\n"
        "m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(400 * 4, 8), batch_size=4)\n"
        "for i, xb in enumerate(loader):\n"
        "    time.sleep(0.25 if i % 37 == 5 else 0.004)\n"
        "    opt.zero_grad(); m(xb).sum().backward(); opt.step()\n")
    run = tmp_path / "run"
    job = Background(tmp_path, "run", "--report", "off",
                     "--interval", "100ms", "--flush-interval", "0.5", "--out", str(run), "--",
                     sys.executable, str(script))
    live = LiveEvaluation(builtin_rules())
    try:
        wait_until(lambda: _has_events(run), 60, what="the first events")
        feed = LiveFeed(open_run(str(run)))
        evaluations = 0
        while job.proc.poll() is None:
            live.evaluate(feed.next())
            evaluations += 1
        assert job.wait(60) == 0, job.stderr
        live_results = live.evaluate(feed.next(final=True))
    finally:
        job.kill_all()
    assert evaluations >= 3
    batch = evaluate(builtin_rules(), [read_run(open_run(str(run)))])
    for a, b in zip(live_results, batch):
        assert json.dumps(a.to_json(), sort_keys=True, default=str) == json.dumps(b.to_json(), sort_keys=True,
                                                                                    default=str), a.name
    steps = next(r for r in batch if r.name == "StepOutlier")
    assert steps.datapoints == 400


def test_stallwatch_rules_follow_a_running_job_then_summarise(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import time, torch\n"
        "m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "for xb in torch.utils.data.DataLoader(torch.randn(600, 8), batch_size=4):\n"
        "    time.sleep(0.02); opt.zero_grad(); m(xb).sum().backward(); opt.step()\n")
    run = tmp_path / "run"
    job = Background(tmp_path, "run", "--report", "off",
                     "--rules-interval", "0", "--out", str(run), "--", sys.executable, str(script))
    try:
        wait_until(lambda: (run / "nodes").exists(), 60, what="the run")
        p = run_cli(tmp_path, "rules", str(run), "--follow", "--every", "1", timeout=120)
        assert job.wait(60) == 0
    finally:
        job.kill_all()
    out = p.stdout.decode()
    assert p.returncode == 0, p.stderr
    assert "so far:" in out and "final:" in out
    assert "rules were triggered" in out or "No rule was triggered" in out
    assert json.loads((run / "rules" / "StepOutlier.json").read_text())["Datapoints"] == 150


def test_stallwatch_run_evaluates_the_rules_and_prints_them(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "for xb in torch.utils.data.DataLoader(torch.randn(200, 8), batch_size=4):\n"
        "    opt.zero_grad(); m(xb).sum().backward(); opt.step()\n")
    jobs = {}
    try:  # the two runs side by side (independent: their own run directories and output files)
        for interval in ("1", "0"):
            jobs[interval] = Background(tmp_path, "run", "--report", "off", "--rules-interval", interval,
                                        "--out", str(tmp_path / f"run-{interval}"), "--", sys.executable, str(script),
                                        name=f"launcher-{interval}")
        codes = {interval: job.wait(120) for interval, job in jobs.items()}
    finally:
        for job in jobs.values():
            job.kill_all()
    for interval, job in jobs.items():
        run = tmp_path / f"run-{interval}"
        assert codes[interval] == 0, job.stderr
        assert "rule" in job.stderr and "Dataloader" in job.stderr
        assert json.loads((run / "rules" / "StepOutlier.json").read_text())["Datapoints"] == 50
        assert len(list((run / "rules").glob("*.json"))) == len(builtin_rules())
