"""The dashboard's server as a user's browser and scripts meet it: a real `stallwatch dashboard` process, its
JSON documents equal to what the analysis layer says, live notices when the run grows, the profiling
controls writing the run's config, and refusals (wrong Host, missing token, port taken, not a run) that are
one clear line."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.records import MetricKey
from stallwatch.store.location import RunLocation
from stallwatch.store.system_writer import SystemWriter

from .conftest import serve


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def _doc(url: str) -> dict:
    status, _, body = _get(url)
    assert status == 200, body[:500]
    return json.loads(body)


def test_the_documents_are_the_analysis_layers(served, runs_dir):
    root, planted = runs_dir
    runs = _doc(served.url + "api/runs")
    assert sorted(r["id"] for r in runs["runs"]) == ["cpu-only", "two-nodes"]
    doc = _doc(served.url + "api/runs/two-nodes/overview")
    analysis = RunAnalysis(str(planted.root))
    assert doc["findings"]["verdict"] == analysis.findings.verdict and doc["findings"]["findings"]
    assert {r["RuleName"] for r in doc["rules"]} >= {c.name for c in builtin_rules()}
    assert sorted(doc["usage"]) == ["algo-1", "algo-2"] and doc["nodes"] == ["algo-1", "algo-2"]
    nodes = _doc(served.url + "api/runs/two-nodes/nodes/algo-1")
    titles = [p["title"] for p in nodes["panels"]]
    assert titles == [p.title for p in analysis.timeline_panels(["algo-1"])]
    assert all(len(s["ts"]) == len(s["values"]) > 0 for p in nodes["panels"] for s in p["series"])
    ranks = _doc(served.url + "api/runs/two-nodes/ranks")
    assert len(ranks["ranks"]) == 4 and len(ranks["step_ms"]) == 4 and ranks["straggler"]["RuleName"] == "Straggler"
    status, headers, body = _get(served.url + "api/runs/two-nodes/report.html")
    assert status == 200 and b"<html" in body[:2000].lower() and "attachment" in headers["content-disposition"]
    for bad in ("nope", "..%2F..%2Fetc", ".hidden"):
        assert _get(served.url + f"api/runs/{bad}/overview")[0] == 404
    assert _get(served.url + "api/runs/two-nodes/nodes/no-such-node")[0] == 500


def test_the_page_and_its_assets_come_from_the_package_with_a_strict_policy(served):
    status, headers, body = _get(served.url)
    assert status == 200 and b"/static/app.js" in body and b"<script>" not in body  # no inline script
    assert "script-src 'self'" in headers["content-security-policy"] and "frame-ancestors 'none'" in headers[
        "content-security-policy"]
    assert _get(served.url + "static/app.js")[0] == 200 and _get(served.url + "static/../cli.py")[0] == 404


def test_a_foreign_host_header_is_refused(served):
    port = urlsplit(served.url).port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/api/runs", headers={"Host": f"attacker.example:{port}"})
    assert conn.getresponse().status == 421  # DNS rebinding reaches loopback servers


def test_a_new_flush_reaches_the_event_stream(served, runs_dir):
    """One follower lists the run every second; every open stream gets the new version."""
    root, _ = runs_dir
    port = urlsplit(served.url).port
    streams = []
    for _ in range(2):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/api/runs/cpu-only/events")
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
        first = json.loads(response.readline().decode().removeprefix("data: "))
        response.readline()
        streams.append((conn, response, first["version"]))
    t0 = time.monotonic()
    writer = SystemWriter(RunLocation(str(root / "cpu-only")), "vm-late", [MetricKey("cpu", "cpu_util")],
                          interval_us=500_000, flush_interval_us=500_000, max_bytes=1 << 30)
    ts = 1_763_790_000_000_000 + 3_600_000_000
    writer.append(ts, [42.0])
    writer.flush()
    for conn, response, version in streams:
        line = response.readline().decode()
        while not line.startswith("data:"):
            line = response.readline().decode()
        assert json.loads(line.removeprefix("data: "))["version"] > version
        conn.close()
    print(f"flush to stream: {time.monotonic() - t0:.2f} s")


def test_profiling_controls_write_the_runs_live_config(served, runs_dir):
    root, _ = runs_dir
    url = served.url + "api/runs/two-nodes/config"

    def post(body: dict, headers: dict[str, str]) -> tuple[int, dict]:
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    assert post({"detailed_profiling": "120:2"}, {})[0] == 403  # no custom header: not from the page
    assert post({"detailed_profiling": "120:2"}, {"X-Stallwatch": "1", "Origin": "http://evil.example"})[0] == 403
    status, doc = post({"sample_interval_ms": 100}, {"X-Stallwatch": "1"})
    assert status == 400 and "only these fields" in doc["error"]
    status, doc = post({"detailed_profiling": "120:20000"}, {"X-Stallwatch": "1"})
    assert status == 400 and "detailed_profiling" in doc["error"]
    status, doc = post({"detailed_profiling": "120:2"}, {"X-Stallwatch": "1"})
    assert status == 200, doc
    config = json.loads((root / "two-nodes" / "config.json").read_text())
    assert config["detailed_profiling"] in ("120:2", {"start_step": 120, "num_steps": 2}) or "120" in json.dumps(
        config["detailed_profiling"])


def test_a_token_is_exchanged_for_a_cookie_and_required(runs_dir, tmp_path):
    s = serve(runs_dir[0], tmp_path, "--token", "s3cret")
    try:
        base = s.url.split("?")[0]
        assert _get(base + "api/runs")[0] == 401
        assert _get(base + "api/runs", {"Authorization": "Bearer s3cret"})[0] == 200
        assert _get(base + "api/runs", {"Cookie": "stallwatch_token=s3cret"})[0] == 200
        conn = http.client.HTTPConnection("127.0.0.1", urlsplit(base).port, timeout=30)
        conn.request("GET", "/?token=s3cret")
        r = conn.getresponse()
        assert r.status == 303 and r.getheader("Location") == "/"
        cookie = r.getheader("Set-Cookie")
        assert "stallwatch_token=s3cret" in cookie and "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
        assert b"s3cret" not in _get(base, {"Cookie": "stallwatch_token=s3cret"})[2]  # never in served HTML
    finally:
        s.stop()


@pytest.mark.parametrize("case", ["port-taken", "not-a-run"])
def test_what_stops_the_dashboard_is_one_line(runs_dir, tmp_path, case):
    args = [str(runs_dir[0])]
    holder = None
    if case == "port-taken":
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        args += ["--port", str(holder.getsockname()[1])]
    else:
        args = [str(tmp_path)]
    try:
        p = subprocess.run([sys.executable, "-m", "stallwatch", "dashboard", *args], capture_output=True, text=True,
                           timeout=60)
    finally:
        if holder is not None:
            holder.close()
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert {"port-taken": "choose another --port", "not-a-run": "not a run"}[case] in lines[0]


def test_beyond_loopback_a_token_is_generated_and_required(runs_dir, tmp_path):
    s = serve(runs_dir[0], tmp_path, "--host", "0.0.0.0")
    try:
        token = s.url.split("?token=", 1)[1]
        assert len(token) >= 20
        base = f"http://127.0.0.1:{urlsplit(s.url).port}/"
        assert _get(base + "api/runs")[0] == 401
        assert _get(base + "api/runs", {"Authorization": f"Bearer {token}"})[0] == 200
        assert _get(base + "metrics")[0] == 401  # the metrics too
    finally:
        s.stop()


def test_run_with_dashboard_serves_the_job_while_it_runs_and_stops_with_it(tmp_path):
    """`stallwatch run --dashboard=PORT`: the dashboard in its own process, showing the job while it runs."""
    import re

    run = tmp_path / "run"
    ready = tmp_path / "ready"
    job = tmp_path / "job.py"
    job.write_text("import os, sys, time\nopen(sys.argv[1], 'w').close()\n"
                   "while os.path.exists(sys.argv[1]):\n    time.sleep(0.1)\nsys.exit(5)\n")
    err = tmp_path / "launcher.err"
    with open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "stallwatch", "run", "--dashboard", "0", "--report", "off",
                                 "--flush-interval", "1",
                                 "--out", str(run), "--", sys.executable, str(job), str(ready)],
                                stdout=subprocess.DEVNULL, stderr=e)
    try:
        deadline = time.monotonic() + 90
        url = None
        while url is None and time.monotonic() < deadline:
            m = re.search(r"dashboard of \S+ at (http://\S+)", err.read_text())
            url = m.group(1) if m else None
            time.sleep(0.1)
        assert url, err.read_text()
        doc = _doc(url + "api/runs/run/overview")
        assert doc["exit"]["state"] == "running" and doc["run_id"] == "run"
        from prometheus_client.parser import text_string_to_metric_families

        usage: list = []
        while not usage and time.monotonic() < deadline:  # once the sampler's first flush is stored
            status, headers, body = _get(url + "metrics")
            assert status == 200 and headers["content-type"].startswith("text/plain")
            families = {f.name: f for f in text_string_to_metric_families(body.decode())}
            usage = [s for s in families["stallwatch_node_usage"].samples if s.labels["run"] == "run"]
            time.sleep(0.5)
        assert {s.labels["metric"] for s in usage} >= {"CPU total", "Memory"}
        rules = {s.labels["rule"] for s in families["stallwatch_rule_triggered"].samples}
        assert {c.name for c in builtin_rules()} <= rules
        ready.unlink()  # the job ends
        assert proc.wait(timeout=60) == 5
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "dashboard stopped" in err.read_text()
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "api/runs", timeout=5)


def test_a_zoom_reads_its_range_at_full_resolution(served, runs_dir):
    from stallwatch.store.reader import open_run

    _, planted = runs_dir
    ts = open_run(str(planted.root)).system_wide("algo-1", metrics=["cpu/cpu_util"])["timestamp_us"].to_pylist()
    lo, hi = ts[100], ts[100] + 60_000_000  # one minute
    whole = _doc(served.url + "api/runs/two-nodes/nodes/algo-1")
    zoom = _doc(served.url + f"api/runs/two-nodes/nodes/algo-1?from={lo}&to={hi}")
    cpu = next(p for p in zoom["panels"] if p["title"].startswith("CPU utilization"))
    assert cpu["series"][0]["ts"] == [t for t in ts if lo <= t < hi]  # every sample of that minute
    assert zoom["range"] == [lo, hi] and whole["range"] == [None, None]
