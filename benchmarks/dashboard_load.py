"""The live dashboard over a generated 8-node × 24 h run at 500 ms (report_gen.py's, as the report's benchmark
uses): first charts, a zoom, live lag, server memory and CPU per connected client, bytes sent — side by side
with the baseline a user had before it, building the HTML report of the same run.

Targets (issue 13): first charts within 1.5 s of opening the page; a one-minute zoom at full resolution
within 1 s; a flush on the job's node on screen within 2 s.

Run: python benchmarks/dashboard_load.py [--data DIR] [--nodes 8] [--hours 24] [--clients 10] [--no-baseline]

Method
------
* The run is generated once into --data (report_gen.dataset) with its rules evaluated and stored, as
  `stallwatch run` leaves a run.
* A real `stallwatch dashboard DATA --port 0` process. "First charts" is what the page asks for when it
  opens on a run, in its order: /api/runs, /api/runs/run/overview, then the first node's panels
  /api/runs/run/nodes/<node> (cold: the server's first request for them), timed from the first request to
  the last byte. Then the same again (warm: the analysis is cached until the run changes).
* Zoom: /nodes/<node>?from=&to= over one minute in the middle of the day (every sample of it).
* Live lag: N clients hold /events open; a new system part is written into the run; the time until every
  client has the notice (the follower lists the run every second).
* Server memory (VmRSS) and CPU (schedstat) before the clients, with N clients for 10 s of streaming.
* Baseline: render_report(run) in a fresh process, as `stallwatch report` does.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import cpu_ns, machine, table  # noqa: E402


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _get(port: int, path: str) -> tuple[float, int]:
    t = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    assert r.status == 200, (path, r.status, body[:300])
    conn.close()
    return time.perf_counter() - t, len(body)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("/tmp/dashboard-bench"))
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--no-baseline", action="store_true")
    args = ap.parse_args()
    from report_gen import Shape, dataset

    t = time.perf_counter()
    run, summary = dataset(args.data, Shape(nodes=args.nodes, hours=args.hours))
    print(f"run: {run} ({summary.get('bytes', 0) / 1e6:.0f} MB), ready in {time.perf_counter() - t:.0f} s", flush=True)
    if not (run / "rules").exists():
        subprocess.run([sys.executable, "-m", "stallwatch", "--quiet", "rules", str(run)], check=True,
                       stdout=subprocess.DEVNULL)
    err = args.data / "dashboard.err"
    with open(err, "wb") as e:
        server = subprocess.Popen([sys.executable, "-m", "stallwatch", "dashboard", str(args.data), "--port", "0"],
                                  stdout=subprocess.DEVNULL, stderr=e)
    try:
        while not (m := re.search(r"127\.0\.0\.1:(\d+)/", err.read_text())):
            time.sleep(0.05)
        port = int(m.group(1))
        from stallwatch.store.reader import open_run

        node = sorted(open_run(str(run)).nodes)[0]
        rows = []
        for label in ("cold", "warm"):
            total, sizes = 0.0, 0
            parts = []
            for path in ("/api/runs", "/api/runs/run/overview", f"/api/runs/run/nodes/{node}"):
                dt, n = _get(port, path)
                total += dt
                sizes += n
                parts.append(f"{dt:.2f}")
            rows.append([f"first charts ({label})", f"{total:.2f} s", f"{sizes / 1e6:.2f} MB",
                         "runs / overview / node: " + " / ".join(parts) + " s"])
        ts = open_run(str(run)).system_wide(node, metrics=["cpu/cpu_util"])["timestamp_us"].to_pylist()
        mid = ts[len(ts) // 2]
        dt, n = _get(port, f"/api/runs/run/nodes/{node}?from={mid}&to={mid + 60_000_000}")
        rows.append(["zoom: one minute, full resolution", f"{dt:.2f} s", f"{n / 1e3:.0f} KB", ""])

        # live: N clients on the event stream, then a flush into the run
        rss0, cpu0 = _rss(server.pid), cpu_ns(server.pid)
        got: list[float] = []
        ready = threading.Barrier(args.clients + 1)
        stop = threading.Event()

        def client() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.request("GET", "/api/runs/run/events")
            r = conn.getresponse()
            first = json.loads(r.readline().decode()[6:])["version"]
            r.readline()
            ready.wait()
            while not stop.is_set():
                line = r.readline().decode()
                if line.startswith("data:") and json.loads(line[6:])["version"] > first:
                    got.append(time.perf_counter())
                    break
            conn.close()

        threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
        for th in threads:
            th.start()
        ready.wait()
        time.sleep(10)
        rss_n, cpu_n = _rss(server.pid), cpu_ns(server.pid)
        from stallwatch.records import MetricKey
        from stallwatch.store.location import RunLocation
        from stallwatch.store.system_writer import SystemWriter

        t_flush = time.perf_counter()
        w = SystemWriter(RunLocation(str(run)), "late-node", [MetricKey("cpu", "cpu_util")], interval_us=500_000,
                         flush_interval_us=500_000, max_bytes=1 << 30)
        w.append(ts[-1] + 1_000_000, [50.0])
        w.flush()
        for th in threads:
            th.join(30)
        stop.set()
        lag = max(got) - t_flush if len(got) == args.clients else float("nan")
        rows.append([f"live: a flush on screen, {args.clients} clients", f"{lag:.2f} s", "", f"{len(got)} notified"])
        cpu_pct = (cpu_n - cpu0) / 1e9 / 10 * 100
        rows.append([f"server with {args.clients} streaming clients", f"{cpu_pct:.2f} % CPU",
                     f"{rss_n / 1e6:.0f} MB RSS", f"{(rss_n - rss0) / args.clients / 1e3:.0f} KB more per client"])
        for p in (run / "system" / "late-node").glob("*"):
            p.unlink()
        (run / "system" / "late-node").rmdir()
        (run / "nodes" / "late-node.json").unlink(missing_ok=True)
    finally:
        server.terminate()
        server.wait(30)
    if not args.no_baseline:
        code = ("import sys, time; from stallwatch.present.report import render_report; t = time.perf_counter(); "
                "html = render_report(sys.argv[1]); print(time.perf_counter() - t, len(html))")
        out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=True)
        dt, size = out.stdout.split()
        rows.append(["baseline: build the HTML report", f"{float(dt):.1f} s", f"{int(size) / 1e6:.2f} MB", ""])
    print(f"\n{machine()}; {args.nodes} nodes × {args.hours:g} h at 500 ms\n")
    print(table(["what", "time", "size / memory", "notes"], rows))


if __name__ == "__main__":
    main()
