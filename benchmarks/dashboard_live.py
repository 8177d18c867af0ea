"""The live dashboard while a run is written: lag from a snapshot's write to the clients, the server's CPU and
memory per connected client, and the bytes each client receives — with 1, 4 and 16 clients on one run.

A real `stallwatch dashboard RUN` runs in its own process (as `stallwatch run --dashboard` starts it); this process
writes a live node (16 cores, 8 GPUs: 102 series) through the store's own writer, one snapshot every 500 ms, each
flushed at once (the moment a sampler's flush makes it readable), and holds K server-sent-event streams open like K
browser tabs. Lag: from the write returning to the first message holding that snapshot reaching a client. Server
CPU: its process's CPU time over the measuring window, per second of wall time.

Run: python benchmarks/dashboard_live.py [--seconds 30] [--clients 1,4,16]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_ns, machine, table  # noqa: E402
from report_gen import NodeSignal, Shape, system_keys  # noqa: E402

S = 1_000_000
NODE = "algo-1"


@dataclass
class Listener:
    """One browser tab's event stream: when each snapshot's time first arrived, and the bytes received."""
    url: str
    seen: dict[int, float] = field(default_factory=dict)  # snapshot ts -> receive time (monotonic)
    bytes: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with urllib.request.urlopen(self.url, timeout=60) as r:
            name = None
            for raw in r:
                self.bytes += len(raw)
                if self.stop.is_set():
                    return
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: ") and name == "samples":
                    now = time.monotonic()
                    for ts in json.loads(line[6:]).get("ts", []):
                        self.seen.setdefault(int(ts), now)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_run(root: Path, shape: Shape) -> Any:
    from stallwatch.store import layout
    from stallwatch.store.location import RunLocation
    from stallwatch.store.system_writer import SystemWriter

    loc = RunLocation(str(root))
    now = int(time.time() * S)
    loc.write_atomic(layout.RUN_JSON, json.dumps({"format_version": 1, "run_id": root.name, "created_us": now,
                                                  "created_by_node": NODE, "command": ["python", "train.py"],
                                                  "config": {"sample_interval_ms": shape.interval_ms}}).encode())
    loc.write_atomic(layout.node_json(NODE), json.dumps({
        "node": NODE, "start_us": now, "status": "running", "hostname": NODE, "command": ["python", "train.py"],
        "cpu_cores_logical": shape.cores, "sample_interval_ms": shape.interval_ms,
        "gpus": [{"index": g, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85 * 10**9}
                 for g in range(shape.gpus)]}).encode())
    interval = shape.interval_ms * 1000
    return SystemWriter(loc, NODE, system_keys(shape), interval_us=interval, flush_interval_us=interval,
                        max_bytes=1 << 40)


def measure(base: str, run_id: str, server_pid: int, writer: Any, signal: NodeSignal, clients: int,
            seconds: float, interval_s: float) -> dict[str, Any]:
    import psutil

    listeners = [Listener(f"{base}/api/run/{run_id}/live") for _ in range(clients)]
    threads = [threading.Thread(target=ln.run, daemon=True) for ln in listeners]
    for t in threads:
        t.start()
    written: dict[int, float] = {}

    def write_for(duration: float) -> None:
        end = time.monotonic() + duration
        while time.monotonic() < end:
            ts = int(time.time() * S)
            _, values = signal.block(1)
            writer.append(ts, values[0])
            writer.tick(ts + int(interval_s * S))  # due: the snapshot is flushed (readable) when this returns
            written[ts] = time.monotonic()
            time.sleep(max(0.0, interval_s - (time.monotonic() - written[ts])))

    write_for(3.0)  # the streams connect and the reader starts
    written.clear()
    sent0 = [ln.bytes for ln in listeners]
    proc = psutil.Process(server_pid)
    cpu0, t0 = cpu_ns(server_pid), time.monotonic()
    write_for(seconds)
    time.sleep(2 * interval_s + 1.0)  # the last snapshots arrive
    cpu_s, wall = (cpu_ns(server_pid) - cpu0) / 1e9, time.monotonic() - t0
    rss = proc.memory_info().rss
    lags = [ln.seen[ts] - at for ln in listeners for ts, at in written.items() if ts in ln.seen]
    missing = sum(1 for ln in listeners for ts in written if ts not in ln.seen)
    per_client_bytes = [ln.bytes - b for ln, b in zip(listeners, sent0)]
    for ln in listeners:
        ln.stop.set()
    return {"clients": clients, "snapshots": len(written), "lags": np.array(lags), "missing": missing,
            "cpu_pct": 100 * cpu_s / wall, "rss_mb": rss / 2**20,
            "kb_per_client_min": float(np.mean(per_client_bytes)) / 1e3 * 60 / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--clients", default="1,4,16")
    args = ap.parse_args()
    shape = Shape(nodes=1, hours=1, framework=False)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "live-run"
        writer = make_run(root, shape)
        signal = NodeSignal(shape, seed=1)
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "stallwatch", "dashboard", str(root), "--port", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(f"{base}/api/health", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.1)
            idle0 = cpu_ns(server.pid)
            time.sleep(5)
            idle = (cpu_ns(server.pid) - idle0) / 1e9 / 5 * 100
            print(f"{machine()}; server idle (no client): {idle:.2f} % of a core", flush=True)
            rows = []
            for k in [int(x) for x in args.clients.split(",")]:
                m = measure(base, root.name, server.pid, writer, signal, k, args.seconds, shape.interval_ms / 1000)
                lags = m["lags"]
                rows.append([str(k), str(m["snapshots"]), f"{np.median(lags):.2f} s", f"{np.percentile(lags, 95):.2f} s",
                             f"{lags.max():.2f} s", str(m["missing"]), f"{m['cpu_pct']:.1f} %",
                             f"{m['cpu_pct'] / k:.2f} %", f"{m['rss_mb']:.0f} MB", f"{m['kb_per_client_min']:.0f} KB"])
                print(f"{k} clients measured", flush=True)
            print(table(["clients", "snapshots", "lag p50", "lag p95", "lag max", "not received", "server CPU",
                         "CPU per client", "server RSS", "per client per minute"], rows))
        finally:
            writer.close()
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
