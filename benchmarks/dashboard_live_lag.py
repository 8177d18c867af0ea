"""How far the live dashboard's numbers trail the job: a real PyTorch CPU job of 30 ms steps under
`stallwatch run --dashboard PORT` (the dashboard in its own process, as users start it), which writes when it
finished each step (its own clock, its own count). Side by side in one run:

- live  — what the page shows now: the `summary` events of the live stream (`/api/run/ID/live`), the stored summary
          brought up to date with the sampler's live counts (live/<node>.json);
- poll  — the same summary polled (`/api/run/ID/summary`), as a scraper or a fresh page load gets it;
- stored — the baseline, what the page showed before: the summary from the stored parts alone (a RunAnalysis of the
          run read from the rollups, exactly as the dashboard built it), read at the same moments.

Lag of a reading: how long before it was taken the job had already done the steps it shows (steps) and how far
its duration is behind the job's wall clock (duration). Also: the first moment each source shows a step at all.

Run: python benchmarks/dashboard_live_lag.py [--seconds 40] [--port 8771]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, table  # noqa: E402

JOB = '''
import os, sys, time
import torch
from torch.utils.data import DataLoader
log = open(sys.argv[1], "a", buffering=1)
stop = sys.argv[2]
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(torch.randn(4 * 500_000, 8), batch_size=4)
for i, xb in enumerate(loader):
    if os.path.exists(stop):
        break
    time.sleep(0.03)
    opt.zero_grad(); model(xb).sum().backward(); opt.step()
    log.write(f"{i + 1} {time.time()}\\n")
'''
TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_steps(path: Path) -> tuple[list[int], list[float]]:
    counts, times = [], []
    for line in path.read_text().splitlines():
        try:
            n, t = line.split()
            counts.append(int(n))
            times.append(float(t))
        except ValueError:
            pass
    return counts, times


def step_lag(counts: list[int], times: list[float], shown: int, at: float) -> float:
    """How long before `at` the job had done `shown` steps: 0 when it shows what the job has done now."""
    i = bisect.bisect_right(counts, shown)  # the first step the page does not show yet
    if i >= len(counts):
        return 0.0
    return max(at - times[i], 0.0)  # the job finished step counts[i] at times[i]: shown since then, not yet


def get(url: str) -> dict:
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    port = args.port or free_port()
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "STALLWATCH_DASHBOARD_TOKEN": TOKEN}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "job.py").write_text(JOB)
        log, stop, run = tmp_path / "steps.log", tmp_path / "stop", tmp_path / "run"
        log.touch()
        proc = subprocess.Popen([sys.executable, "-m", "stallwatch", "run", "--out", str(run), "--no-gpu",
                                 "--node", "n1", "--report", "off", "--dashboard", str(port), "--",
                                 sys.executable, str(tmp_path / "job.py"), str(log), str(stop)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        started = time.time()
        while True:
            try:
                rid = get(f"{base}/api/runs")["runs"][0]["id"]
                break
            except Exception:
                if time.time() - started > 120:
                    raise SystemExit("the dashboard did not come up")
                time.sleep(0.2)
        stream: list[tuple[float, dict]] = []
        done = threading.Event()

        def listen() -> None:
            req = urllib.request.Request(f"{base}/api/run/{rid}/live", headers={"authorization": f"Bearer {TOKEN}"})
            with urllib.request.urlopen(req, timeout=60) as r:
                name = None
                for raw in r:
                    if done.is_set():
                        return
                    line = raw.decode().rstrip("\n")
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: ") and name == "summary":
                        stream.append((time.time(), json.loads(line[6:])))

        threading.Thread(target=listen, daemon=True).start()
        from stallwatch.analyze.analysis import RunAnalysis
        from stallwatch.store.reader import open_run

        polls: list[tuple[float, dict]] = []
        stored: list[tuple[float, int, float]] = []
        end = time.time() + args.seconds
        while time.time() < end:
            try:
                polls.append((time.time(), get(f"{base}/api/run/{rid}/summary")))
            except Exception:
                pass
            at = time.time()
            a = RunAnalysis(open_run(str(run)), overview_from_rollups=True)  # the old page's figures
            stored.append((at, a.summary.total_steps, a.summary.duration_s))
            time.sleep(0.5)
        stop.touch()
        proc.wait(120)
        done.set()
        counts, times = job_steps(log)
        start_us = json.loads((run / "nodes" / "n1.json").read_text())["start_us"]

    def rows_of(name: str, readings: list[tuple[float, int, float]]) -> list[str]:
        readings = [r for r in readings if times and r[0] > times[0] + 2]  # from the loop's first seconds on
        lags = np.array([step_lag(counts, times, n, at) for at, n, _ in readings])
        dur = np.array([max((at - start_us / 1e6) - d, 0.0) for at, _, d in readings])
        return [name, str(len(readings)), f"{np.median(lags):.2f}", f"{np.percentile(lags, 95):.2f}",
                f"{lags.max():.2f}", f"{np.median(dur):.2f}", f"{dur.max():.2f}"]

    live = [(at, d["total_steps"], d["duration_s"]) for at, d in stream]
    poll = [(at, d["total_steps"], d["duration_s"]) for at, d in polls]
    first = {name: next((at - times[0] for at, n, _ in rs if n > 0), float("nan")) if times else float("nan")
             for name, rs in (("live", live), ("poll", poll), ("stored", stored))}
    print(f"# dashboard live lag: {machine()}, job of 30 ms steps for {args.seconds:.0f} s, "
          f"{len(counts)} steps; flush interval 5 s (default)")
    print(table(["source", "readings", "steps lag p50 (s)", "p95", "max", "duration lag p50 (s)", "max"],
                [rows_of("live stream (now)", live), rows_of("polled summary (now)", poll),
                 rows_of("stored parts (before)", stored)]))
    print("first step shown, s after the job's first step: " +
          ", ".join(f"{k} {v:.1f}" for k, v in first.items()))


if __name__ == "__main__":
    main()
