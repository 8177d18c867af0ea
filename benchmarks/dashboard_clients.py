"""Fifty dashboard clients beside a running job: does the server's work grow with its clients, and does the job
slow down? A real PyTorch CPU job (fixed CPU work per step) under `stallwatch run`; a real `stallwatch dashboard RUN`
started beside it the way `stallwatch run --dashboard` starts it (its own process, `--parent`). Phases of equal
length, one after the other in one run, over the same job:

- no dashboard;
- this dashboard with 1 poller + 1 live stream, and with N pollers + N live streams;
- the baseline dashboard (another checkout's `src`, e.g. main's, `--baseline-src`) with N pollers + N streams.

A poller asks what a page asks when it refreshes (summary, findings, usage, timeline), one question a second; a
stream holds `/api/run/ID/live` open and reads it. Job: steps per second in the phase (its own count). Server: CPU
seconds per wall second, peak RSS.

The clients run in a process of their own at niceness 19 (browsers are elsewhere): what is measured is what the
server does to the job. Phases are interleaved over rounds, each round in another order, and medians reported:
the machine's other load drifts.

Run: python benchmarks/dashboard_clients.py [--clients 50] [--phase 12] [--rounds 3] [--baseline-src /work/main/src]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_ns, machine, table  # noqa: E402
from dashboard_live_lag import free_port  # noqa: E402

JOB = '''
import os, sys, time
import torch
torch.set_num_threads(1)
log = open(sys.argv[1], "a", buffering=1)
stop = sys.argv[2]
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 256)
i = 0
while not os.path.exists(stop):
    opt.zero_grad(); model(x).sum().backward(); opt.step()
    i += 1
    if i % 20 == 0:
        log.write(f"{i} {time.time()}\\n")
'''
TOKEN = "bench-token"
QUESTIONS = ("summary", "findings", "usage", "timeline?node=n1&points=600")


def count_at(log: Path, t: float) -> int:
    last = 0
    for line in log.read_text().splitlines():
        try:
            n, at = line.split()
        except ValueError:
            continue
        if float(at) > t:
            break
        last = int(n)
    return last


class Clients:
    def __init__(self, base: str, rid: str, n: int) -> None:
        self.stop = threading.Event()
        self.requests = 0
        self.errors = 0
        self.threads = [threading.Thread(target=self.poll, args=(base, rid, k), daemon=True) for k in range(n)]
        self.threads += [threading.Thread(target=self.listen, args=(base, rid), daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def _get(self, url: str, timeout: float = 30):
        return urllib.request.urlopen(urllib.request.Request(url, headers={"authorization": f"Bearer {TOKEN}"}),
                                      timeout=timeout)

    def poll(self, base: str, rid: str, k: int) -> None:
        i = k
        while not self.stop.is_set():
            q = QUESTIONS[i % len(QUESTIONS)]
            i += 1
            try:
                with self._get(f"{base}/api/run/{rid}/{q}") as r:
                    r.read()
                self.requests += 1
            except Exception:
                self.errors += 1
            self.stop.wait(1.0)

    def listen(self, base: str, rid: str) -> None:
        try:
            with self._get(f"{base}/api/run/{rid}/live", timeout=60) as r:
                while not self.stop.is_set():
                    if not r.readline():
                        return
        except Exception:
            self.errors += 1

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)


class ClientProcess:
    """The clients in a process of their own at the lowest priority: browsers are elsewhere; what is measured is
    what the server does to the job, not what 100 client threads in this script would."""

    def __init__(self, base: str, rid: str, n: int) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-clients", base, rid, str(n)],
                                     stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.nice(19))
        self.requests = self.errors = 0

    def close(self) -> None:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        for line in out.splitlines():
            if line.startswith("requests "):
                _, req, err = line.split()
                self.requests, self.errors = int(req), int(err)


def serve_clients(base: str, rid: str, n: int) -> None:
    import signal

    clients = Clients(base, rid, n)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    clients.stop.set()
    print(f"requests {clients.requests} {clients.errors}", flush=True)


def phase(seconds: float, log: Path, server: psutil.Process | None, clients: ClientProcess | None) -> dict[str, float]:
    time.sleep(2.0)  # the clients connected and asked once
    t0 = time.time()
    c0 = cpu_ns(server.pid) if server else 0
    rss = 0
    while time.time() - t0 < seconds:
        if server:
            try:
                rss = max(rss, server.memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(0.5)
    t1 = time.time()
    c1 = cpu_ns(server.pid) if server else 0
    if clients:
        clients.close()
    return {"steps_per_s": (count_at(log, t1) - count_at(log, t0)) / (t1 - t0),
            "cpu": (c1 - c0) / 1e9 / (t1 - t0), "rss": rss / 2**20,
            "requests": clients.requests * (t1 - t0) / (t1 - t0 + 2.0) if clients else 0,
            "errors": clients.errors if clients else 0}


def start_dashboard(src: str, run: Path, port: int, parent: int) -> psutil.Process:
    env = {**os.environ, "PYTHONPATH": src, "STALLWATCH_DASHBOARD_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "stallwatch", "dashboard", str(run), "--port", str(port),
                             "--wait", "60", "--parent", str(parent)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return psutil.Process(proc.pid)


def wait_up(base: str) -> str:
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{base}/api/runs", headers={
                    "authorization": f"Bearer {TOKEN}"}), timeout=10) as r:
                return json.loads(r.read())["runs"][0]["id"]
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def main() -> None:
    if sys.argv[1:2] == ["--serve-clients"]:
        serve_clients(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--phase", type=float, default=12.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-src", default="/work/main/src")
    args = ap.parse_args()
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    n = args.clients
    names = ["no dashboard", "this dashboard, 1 + 1 clients", f"this dashboard, {n} + {n} clients",
             f"baseline dashboard, {n} + {n} clients"]
    results: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "job.py").write_text(JOB)
        log, stop, run = tmp_path / "steps.log", tmp_path / "stop", tmp_path / "run"
        log.touch()
        job = subprocess.Popen([sys.executable, "-m", "stallwatch", "run", "--out", str(run), "--no-gpu", "--node",
                                "n1", "--report", "off", "--", sys.executable, str(tmp_path / "job.py"), str(log),
                                str(stop)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers = []
        try:
            while count_at(log, time.time()) < 100:
                time.sleep(0.5)
            for where in (src, args.baseline_src):  # both up all along; idle without clients
                port = free_port()
                servers.append((start_dashboard(where, run, port, os.getpid()), f"http://127.0.0.1:{port}"))
            rids = [wait_up(base) for _, base in servers]
            (this, this_base), (old, old_base) = servers
            plan = {names[0]: (None, None), names[1]: (this, lambda: ClientProcess(this_base, rids[0], 1)),
                    names[2]: (this, lambda: ClientProcess(this_base, rids[0], n)),
                    names[3]: (old, lambda: ClientProcess(old_base, rids[1], n))}
            for k in range(args.rounds):  # interleaved, each round in another order: a busy machine's drift evens out
                order = names[k % len(names):] + names[:k % len(names)]
                for name in order:
                    server, make = plan[name]
                    results[name].append(phase(args.phase, log, server, make() if make else None))
        finally:
            for server, _ in servers:
                server.terminate()
            stop.touch()
            job.wait(120)

    def med(rs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rs)

    alone = med(results[names[0]], "steps_per_s")
    rows = []
    for name in names:
        rs = results[name]
        served = name != names[0]
        rows.append([name, f"{med(rs, 'steps_per_s'):.1f}", f"{(med(rs, 'steps_per_s') / alone - 1) * 100:+.1f} %",
                     f"{med(rs, 'cpu'):.3f}" if served else "–", f"{max(r['rss'] for r in rs):.0f}" if served else "–",
                     f"{med(rs, 'cpu') / max(med(rs, 'requests'), 1) * args.phase * 1000:.1f}" if served else "–",
                     str(int(sum(r["requests"] for r in rs))), str(int(sum(r["errors"] for r in rs)))])
    print(f"# load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"# dashboard clients: {machine()}, {args.rounds} rounds of {args.phase:.0f} s phases (medians), pollers "
          f"ask {', '.join(QUESTIONS)} in turn, one question a second each; baseline = {args.baseline_src}")
    print(table(["phase", "job steps/s", "vs alone", "server CPU (cores)", "server peak RSS (MB)",
                 "server CPU ms / request", "requests", "errors"], rows))


if __name__ == "__main__":
    main()
