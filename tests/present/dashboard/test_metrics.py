"""`/metrics` as Prometheus scrapes it: while `stallwatch run --dashboard` profiles a job, the running run's
utilization, steps and rule states in the text format (parsed with the official client's parser); finished
runs are left out; the token guards it like the rest."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from stallwatch.analyze.rules.registry import builtin_rules
from tests.present.dashboard.conftest import request, start_dashboard


def _families(body: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_a_running_job_is_scraped_and_finished_runs_are_left_out(tmp_path: Path) -> None:
    run, ready = tmp_path / "live", tmp_path / "ready"
    job = tmp_path / "job.py"
    job.write_text("import os, sys, time\nopen(sys.argv[1], 'w').close()\n"
                   "while os.path.exists(sys.argv[1]):\n    time.sleep(0.1)\n")
    err = tmp_path / "launcher.err"
    with open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "stallwatch", "run", "--dashboard", "0", "--report", "off",
                                 "--flush-interval", "1", "--out", str(run), "--", sys.executable, str(job),
                                 str(ready)], stdout=subprocess.DEVNULL, stderr=e)
    try:
        deadline = time.monotonic() + 90
        url = None
        while url is None and time.monotonic() < deadline:
            m = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", err.read_text())
            url, token = (m.group(1), m.group(2)) if m else (None, None)
            time.sleep(0.1)
        assert url, err.read_text()
        usage: list = []
        while not usage and time.monotonic() < deadline:  # once the sampler's first flush is stored
            status, headers, body = request(url + "metrics", headers={"authorization": f"Bearer {token}"})
            assert status == 200 and headers["content-type"].startswith("text/plain"), body[:300]
            families = _families(body)
            usage = families["stallwatch_node_usage"].samples if "stallwatch_node_usage" in families else []
            time.sleep(0.5)
        assert {s.labels["metric"] for s in usage} >= {"CPU total", "Memory"}
        assert {s.labels["run"] for s in usage} == {"live"}
        assert {c.name for c in builtin_rules()} <= {s.labels["rule"] for s in families["stallwatch_rule_triggered"].samples}
        ready.unlink()  # the job ends
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_finished_runs_give_an_empty_scrape_and_the_token_guards_it(runs_root: Path) -> None:
    d = start_dashboard(runs_root, token="s3cret")
    try:
        assert d.get("/metrics", auth=False)[0] == 401
        status, _, body = d.get("/metrics", {"Authorization": "Bearer s3cret"})
        assert status == 200 and not [s for f in _families(body).values() for s in f.samples]
    finally:
        d.stop()
