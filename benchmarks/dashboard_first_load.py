"""Time to the dashboard's first charts on a generated multi-node run (benchmarks/report_gen.py; the target is
8 nodes × 24 h at 500 ms) against the baseline of building its HTML report, in one run.

A real dashboard (uvicorn on a loopback port, in this process) answers what the page asks on opening, as the
page asks it: the Overview's summary + findings + utilization at once, then the Nodes view's first node
(timeline of the whole run, its events, its last 30 steps), then a one-minute zoom. Each run gets a fresh
server (no warm caches). The rules are evaluated and stored first, as `stallwatch run` leaves a run.

Run: python benchmarks/dashboard_first_load.py --data DIR [--nodes 8] [--hours 24]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, peak_rss, table  # noqa: E402
from report_gen import Shape, dataset  # noqa: E402


def serve(run_dir: Path) -> tuple[str, Any, threading.Thread]:
    import uvicorn

    from stallwatch.present.dashboard.app import create_app
    from stallwatch.present.dashboard.server import listen, open_served

    listening, policy = listen("127.0.0.1", 0, None)
    server = uvicorn.Server(uvicorn.Config(create_app(open_served(str(run_dir)), policy), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening.sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{listening.port}", server, thread


def get(url: str) -> tuple[float, int]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        n = len(r.read())
    return time.perf_counter() - t, n


def measure(run_dir: Path) -> dict[str, Any]:
    base, server, thread = serve(run_dir)
    rid = run_dir.name
    api = f"{base}/api/run/{rid}"
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(3) as pool:  # the Overview asks these at once
        answers = dict(zip(("summary", "findings", "usage"),
                           pool.map(get, [f"{api}/summary", f"{api}/findings", f"{api}/usage"])))
    out["overview"] = time.perf_counter() - t0
    out["overview_bytes"] = sum(n for _, n in answers.values())
    out.update({f"{k}_s": v[0] for k, v in answers.items()})
    summary = json.loads(urllib.request.urlopen(f"{api}/summary").read())
    node = summary["nodes"][0]["name"]
    t1 = time.perf_counter()
    timeline_s, timeline_bytes = get(f"{api}/timeline?node={node}&points=650")
    out["nodes_timeline_s"], out["nodes_timeline_bytes"] = timeline_s, timeline_bytes
    out["nodes_events_s"] = get(f"{api}/events?node={node}")[0]
    out["nodes_steps_s"] = get(f"{api}/steps?node={node}&last=30")[0]
    out["nodes"] = time.perf_counter() - t1
    out["first_charts"] = out["overview"] + out["nodes"]
    mid = (summary["start_us"] + summary["last_us"]) // 2
    out["zoom_s"] = get(f"{api}/timeline?node={node}&points=650&from={mid}&to={mid + 60_000_000}")[0]
    server.should_exit = True
    thread.join(10)
    return out


def report_baseline(run_dir: Path) -> float:
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present.report import render_report

    t = time.perf_counter()
    render_report(RunAnalysis(str(run_dir)))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24.0)
    args = ap.parse_args()
    shape = Shape(nodes=args.nodes, hours=args.hours)
    t = time.perf_counter()
    run_dir, info = dataset(args.data, shape)
    print(f"data: {args.nodes} nodes × {args.hours:g} h at 500 ms ({time.perf_counter() - t:.1f} s to get it); "
          f"{machine()}", flush=True)
    from report_cost import with_stored_rules

    if not (run_dir / "rules").exists():
        print(f"rules stored in {with_stored_rules(run_dir):.1f} s", flush=True)
    m = measure(run_dir)
    rep = report_baseline(run_dir)
    rows = [["Overview: summary + findings + utilization (at once)", f"{m['overview']:.2f} s",
             f"{m['overview_bytes'] / 1e3:.0f} KB"],
            ["  summary / findings / usage alone", f"{m['summary_s']:.2f} / {m['findings_s']:.2f} / {m['usage_s']:.2f} s", ""],
            ["Nodes: first node's timeline (whole run, 650 buckets)", f"{m['nodes_timeline_s']:.2f} s",
             f"{m['nodes_timeline_bytes'] / 1e3:.0f} KB"],
            ["Nodes: its events + last 30 steps", f"{m['nodes_events_s'] + m['nodes_steps_s']:.2f} s", ""],
            ["**first charts** (Overview, then Nodes)", f"{m['first_charts']:.2f} s", ""],
            ["zoom to one minute (full resolution)", f"{m['zoom_s']:.3f} s", ""],
            ["baseline: build the HTML report", f"{rep:.2f} s", ""]]
    print(table(["what", "time", "sent"], rows))
    print(f"peak memory {peak_rss() / 2**20:.0f} MB")


if __name__ == "__main__":
    main()
