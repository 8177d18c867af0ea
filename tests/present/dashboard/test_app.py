"""The JSON API against a real uvicorn server and real runs: every document the page uses, downsampling that
keeps peaks, the report download (built once per run version), profiling requests written to the run's live
configuration, and the boundaries (run ids, nodes, methods)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stallwatch.store import run_files
from stallwatch.store.location import RunLocation
from tests.present.dashboard.conftest import Dashboard, request
from tests.present.report._full_runs import BOTTLENECK, IMG


def test_runs_lists_every_run_with_its_status(dashboard: Dashboard) -> None:
    # on loopback too, nothing is served without the token (another local user could steer the job)
    assert dashboard.get("/api/runs", auth=False)[0] == 401
    assert request(dashboard.url + "api/run/run-b/profiling", method="POST", data=b"{}", auth=False,
                   headers={"content-type": "application/json", "x-stallwatch": "1"})[0] == 401
    doc = dashboard.json("/api/runs")
    assert not doc["single"]
    assert {r["id"] for r in doc["runs"]} == {"run-a", "run-b", "run-xss"}
    assert all(r["status"] == "succeeded" for r in doc["runs"])


def test_summary_and_findings_are_the_analysis(dashboard: Dashboard) -> None:
    from stallwatch.analyze.analysis import RunAnalysis

    s = dashboard.json("/api/run/run-a/summary")
    a = RunAnalysis(str(dashboard.root / "run-a"))
    assert s["steps"] == a.summary.steps and s["total_steps"] == a.summary.total_steps > 0
    assert [n["name"] for n in s["nodes"]] == ["algo-1", "algo-2"]
    assert s["fate"]["state"] == "succeeded" and set(s["parts_s"]) == {"Initialization", "Training loop", "Finalization"}
    assert s["progress"]["steps"][-1] == a.steps.n
    f = dashboard.json("/api/run/run-a/findings")
    assert [x["rule"] for x in f["findings"]] == [x.rule for x in a.findings.findings]
    assert "CPUBottleneck" in [x["rule"] for x in f["findings"]]
    assert {r["name"] for r in f["rules"]} == {r.name for r in a.rule_results}
    fired = {r["name"] for r in f["rules"] if r["triggered"]}
    assert "CPUBottleneck" in fired and all(r["description"] for r in f["rules"])


def test_usage_per_node_and_all_nodes(dashboard: Dashboard) -> None:
    u = dashboard.json("/api/run/run-a/usage")
    assert set(u["nodes"]) == {"algo-1", "algo-2"}
    labels = {x["label"] for x in u["nodes"]["algo-1"]}
    assert {"CPU total", "GPU", "GPU memory", "Memory"} <= labels
    assert {x["label"] for x in u["all"]} >= {"CPU total", "GPU"}


def test_timeline_downsamples_within_budget_and_keeps_the_planted_peak(dashboard: Dashboard) -> None:
    whole = dashboard.json("/api/run/run-a/timeline?node=algo-1&points=100")
    assert len(whole["ts"]) <= 100 and whole["snapshots"] == 1200 and not whole["full_resolution"]
    assert whole["cores"] == ["cpu0", "cpu1", "cpu2", "cpu3"] and whole["gpus"] == ["gpu0", "gpu1"]
    # the planted bottleneck saturates cpu0: its maximum survives the reduction, the GPUs' band goes to 0
    assert max(v for v in whole["series"]["cpu0"]["max"] if v is not None) >= 95
    assert min(v for v in whole["series"]["gpu_lo"]["min"] if v is not None) <= 5
    t0 = whole["ts"][0]
    zoom = dashboard.json(f"/api/run/run-a/timeline?node=algo-1&points=600&from={t0}&to={t0 + 60_000_000}")
    assert zoom["full_resolution"] and 100 <= zoom["snapshots"] <= 121
    assert all(t0 <= t < t0 + 60_000_000 for t in zoom["ts"])
    start_bottleneck = t0 + BOTTLENECK[0] * 500_000
    assert whole["last_sample_us"] >= start_bottleneck


def test_events_steps_ranks_heatmap_operators(dashboard: Dashboard) -> None:
    s = dashboard.json("/api/run/run-a/summary")
    mid = s["progress"]["t"][len(s["progress"]["t"]) // 5]  # inside the first training pass
    ev = dashboard.json(f"/api/run/run-a/events?node=algo-1&from={mid}&to={mid + 2_000_000}")
    kinds = {t["kind"] for t in ev["totals"]}
    assert {"step", "forward", "backward"} <= kinds and ev["steps"] >= 2 and ev["events"]
    assert all(e["end_us"] > mid and e["start_us"] < mid + 2_000_000 for e in ev["events"])
    whole = dashboard.json("/api/run/run-a/events?node=algo-1")
    assert whole["truncated"] and not whole["events"] and whole["total_events"] > 4000
    st = dashboard.json("/api/run/run-a/steps?node=algo-1&last=30")
    assert len(st["steps"]) == 30
    assert all(x["duration_ms"] >= sum(x["phases_ms"].values()) - 0.01 for x in st["steps"])
    r = dashboard.json("/api/run/run-a/ranks")
    assert r["ranks"] == ["algo-1/0", "algo-1/1", "algo-2/0", "algo-2/1"] and len(r["step_ms"]) == 4
    h = dashboard.json("/api/run/run-a/heatmap?node=algo-1")
    assert "cpu0" in " ".join(h["names"]) and len(h["values"]) == len(h["names"])
    ops = dashboard.json("/api/run/run-a/operators")
    assert ops["operators"][0]["name"].startswith("volta_sgemm")


def test_report_download_is_the_report_and_is_cached(dashboard: Dashboard) -> None:
    status, headers, body = dashboard.get("/api/run/run-b/report")
    assert status == 200 and "attachment" in headers["content-disposition"]
    assert body.startswith(b"<!DOCTYPE html>") or b"<html" in body[:500]
    assert b"stallwatch profiling report" in body
    status, _, again = dashboard.get("/api/run/run-b/report")
    assert again is not None and again == body  # the same bytes: built once while the run is unchanged


def test_profiling_request_writes_the_live_config(dashboard: Dashboard) -> None:
    loc = RunLocation(str(dashboard.root / "run-b"))
    url = dashboard.url + "api/run/run-b/profiling"
    body = json.dumps({"layer": "detailed", "start_step": "40", "num_steps": "3"}).encode()
    hdr = {"content-type": "application/json", "x-stallwatch": "1", "origin": dashboard.url.rstrip("/")}
    status, _, out = request(url, method="POST", data=body, headers=hdr)
    assert status == 200, out
    assert run_files.read_config(loc).detailed_profiling.to_spec() == "40:3"
    doc = json.loads(out)
    assert doc["live"]["detailed_profiling"] == "40:3"
    assert doc["requests"][-1]["layer"] == "detailed" and doc["requests"][-1]["picked_up_us"] is None
    # a time window, for data-loader timing
    status, _, out = request(url, method="POST", data=json.dumps({"layer": "dataloader", "duration_s": "30"}).encode(),
                             headers=hdr)
    assert status == 200 and run_files.read_config(loc).dataloader_profiling.duration_s == 30
    # refused: too many detailed steps (the config's own check), an unknown layer; the file is unchanged
    for bad in ({"layer": "detailed", "start_step": "1", "num_steps": "1000"}, {"layer": "gpu"}):
        status, _, out = request(url, method="POST", data=json.dumps(bad).encode(), headers=hdr)
        assert status == 400 and json.loads(out)["error"]
    assert run_files.read_config(loc).detailed_profiling.to_spec() == "40:3"
    # cleared
    status, _, _ = request(url, method="POST", data=json.dumps({"layer": "detailed", "clear": True}).encode(), headers=hdr)
    assert status == 200 and run_files.read_config(loc).detailed_profiling is None


def test_bad_bodies_and_capture_questions_get_the_reason_not_a_500_or_no_such_run(dashboard: Dashboard) -> None:
    url = dashboard.url + "api/run/run-b/profiling"
    hdr = {"content-type": "application/json", "x-stallwatch": "1", "origin": dashboard.url.rstrip("/")}
    # a body declared at 400 MB is refused before any of it is read
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", dashboard.port, timeout=30)
    conn.putrequest("POST", "/api/run/run-b/profiling")
    for k, v in {**hdr, **dashboard.auth, "content-length": str(400 << 20)}.items():
        conn.putheader(k, v)
    conn.endheaders()
    answer = conn.getresponse()
    assert answer.status == 413 and "at most" in json.loads(answer.read())["error"]
    conn.close()
    # nested 100,000 deep: a parse error, not a RecursionError 500
    status, _, out = request(url, method="POST", data=b"[" * 30_000 + b"]" * 30_000, headers=hdr)
    assert status == 400 and "JSON object" in json.loads(out)["error"]
    # a capture's file of a run that exists: what is missing or unknown is said, never "no such run here"
    status, _, out = request(dashboard.url + "api/run/run-b/capture")
    assert status == 400 and "node, rank, window, file" in json.loads(out)["error"]
    status, _, out = request(dashboard.url + "api/run/run-b/capture?node=algo-1&rank=0&window=nope&file=x.json")
    assert status == 404 and "no capture 'nope'" in json.loads(out)["error"]


def test_control_requests_need_the_header_and_the_same_origin(dashboard: Dashboard) -> None:
    url = dashboard.url + "api/run/run-b/profiling"
    body = json.dumps({"layer": "detailed"}).encode()
    status, _, _ = request(url, method="POST", data=body, headers={"content-type": "application/json"})
    assert status == 403
    status, _, _ = request(url, method="POST", data=body, headers={"content-type": "application/json",
                                                                   "x-stallwatch": "1", "origin": "http://evil.example"})
    assert status == 403


def test_unknown_runs_nodes_and_paths_are_refused(dashboard: Dashboard, tmp_path: Path) -> None:
    outside = tmp_path / "outside-run"
    from tests.present.generated_run import training_run

    training_run(outside, with_framework=False, n=20)
    link = dashboard.root / "linked"
    os.symlink(outside, link)
    try:
        for rid in ("nope", "..", "%2e%2e", "..%2Fetc", "run-a%2F..%2Frun-b", "linked", "%2Fetc", "run-a%00"):
            status, _, _ = dashboard.get(f"/api/run/{rid}/summary")
            assert status == 404, rid
        status, _, _ = dashboard.get("/static/..%2F..%2Fapp.py")
        assert status == 404
        status, _, body = dashboard.get("/api/run/run-a/timeline?node=..%2Fsecret")
        assert status == 400 and b"no such node" in body
        status, _, _ = dashboard.get("/api/run/run-a/timeline?from=abc")
        assert status == 400
    finally:
        link.unlink()


def test_host_header_is_checked(dashboard: Dashboard) -> None:
    status, _, _ = dashboard.get("/api/runs", headers={"host": "attacker.example:8050"})
    assert status == 421
    status, _, _ = dashboard.get("/api/runs", headers={"host": f"localhost:{dashboard.port}"})
    assert status == 200


def test_page_is_static_with_a_strict_policy(dashboard: Dashboard) -> None:
    status, headers, body = dashboard.get("/")
    assert status == 200 and "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert b"<script>" not in body and b"http" not in body.replace(b"http-equiv", b"")  # nothing from elsewhere
    status, _, js = dashboard.get("/static/dashboard.js")
    assert status == 200 and b"innerHTML" not in js and b"eval(" not in js
    summary = dashboard.json("/api/run/run-xss/summary")
    assert IMG in summary["command"]  # the payload travels as data; the page puts it in textContent


def test_two_runs_compared_as_the_compare_command_says(dashboard: Dashboard) -> None:
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.store.reader import Run

    doc = dashboard.json("/api/run/run-a/compare?baseline=run-b")
    assert doc["schema"].startswith("stallwatch.dashboard.compare/")
    assert (doc["baseline_id"], doc["run_id"]) == ("run-b", "run-a")
    root = dashboard.root
    expected = RunAnalysis(Run(str(root / "run-a"))).compare_to(RunAnalysis(Run(str(root / "run-b"))))
    assert doc["p50_change_pct"] == pytest.approx(expected.slower_pct())
    assert doc["findings"]["appeared"] == expected.findings_appeared
    status, _, body = dashboard.get("/api/run/run-a/compare")
    assert status == 400 and b"baseline" in body
    status, _, body = dashboard.get("/api/run/run-a/compare?baseline=nope")
    assert status == 404 and b"nope" in body  # says which run, not "no such run" of the one asked about
