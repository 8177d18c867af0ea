"""Sampler cost: µs per snapshot (all metrics) and % of one core at 100 ms and 500 ms, stallwatch's sampler
process side by side with a naive psutil loop sampling the same metrics (benchmarks/naive_monitor.py).

Targets (issue 2): <= 250 µs per snapshot, <= 0.1 % of one core at 500 ms.
Also at 500 ms: the sampler with its event socket open (as under `stallwatch run`), optionally an earlier
checkout's (`--before`), and the floor: a loop that only wakes and reads the five /proc files (proc_floor.py).
Run: python benchmarks/sampler_cost.py [--seconds 60] [--snapshots 3000] [--before OLD/src]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_ns, machine, start_job, stop_job, table  # noqa: E402
from naive_monitor import sample as naive_sample  # noqa: E402

from stallwatch.collect.sampler_process import StartMessage  # noqa: E402
from stallwatch.collect.system import SystemSampler  # noqa: E402


FLUSH_S = 5.0


def per_snapshot(n: int, job_pid: int) -> dict[str, list[float]]:
    """In-process cost of one snapshot, the two samplers interleaved so both see the same machine noise."""
    ours = SystemSampler()
    ours.set_job_pid(job_pid)
    root = psutil.Process(job_pid)
    ours.snapshot()
    naive_sample(root)
    out: dict[str, list[float]] = {"stallwatch": [], "naive psutil": []}
    for _ in range(n):
        t0 = time.perf_counter_ns()
        ours.snapshot()
        t1 = time.perf_counter_ns()
        naive_sample(root)
        t2 = time.perf_counter_ns()
        out["stallwatch"].append((t1 - t0) / 1000)
        out["naive psutil"].append((t2 - t1) / 1000)
        time.sleep(0.001)
    ours.close()
    return out


def _wait_ready(proc: subprocess.Popen, timeout: float = 30) -> None:
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while b"ready" not in buf:
        r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            raise RuntimeError("process did not get ready")
        buf += os.read(fd, 64)


def _sampler(workdir: Path, name: str, interval: int, job_pid: int, events: bool,
             src: str | None = None) -> subprocess.Popen:
    """A real sampler process; with `events`, its socket for the job's framework events is open (as under
    `stallwatch run`); `src` runs another checkout's code (an earlier commit)."""
    kw = {}
    if events:
        (workdir / name).mkdir()
        kw = {"events_address": str(workdir / name / "events.sock"), "staging_dir": str(workdir / name)}
    start = StartMessage(run=str(workdir / f"run-{name}"), node="bench", sample_interval_ms=interval,
                         flush_interval_s=FLUSH_S, max_storage_bytes=1 << 30, **kw)
    env = dict(os.environ, PYTHONPATH=src) if src else None
    p = subprocess.Popen([sys.executable, "-m", "stallwatch.collect.sampler_process"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    p.stdin.write((start.to_json() + "\n").encode())
    p.stdin.write((json.dumps({"pid": job_pid}) + "\n").encode())
    p.stdin.flush()
    return p


def process_cost(seconds: float, job_pid: int, workdir: Path, before: str | None) -> list[list[str]]:
    """Whole-process CPU of each sampler running for `seconds`, measured after start-up imports."""
    procs = {}
    for interval in (100, 500):
        procs[("stallwatch", interval)] = _sampler(workdir, f"sw-{interval}", interval, job_pid, events=False)
        q = subprocess.Popen([sys.executable, str(Path(__file__).parent / "naive_monitor.py"), str(interval),
                              str(workdir / f"naive-{interval}.jsonl"), str(job_pid)], stdout=subprocess.PIPE)
        procs[("naive psutil", interval)] = q
    procs[("stallwatch, events socket open", 500)] = _sampler(workdir, "sw-events", 500, job_pid, events=True)
    if before:
        procs[("before, events socket open", 500)] = _sampler(workdir, "before", 500, job_pid, events=True,
                                                              src=before)
    procs[("floor: 5 /proc reads, no parsing or storing", 500)] = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "proc_floor.py"), "500", str(job_pid)], stdout=subprocess.PIPE)
    for p in procs.values():
        _wait_ready(p)
    # Past the first flush: it imports the Parquet writer and pyarrow.compute once (0.4 s of CPU on a 16-core
    # H100 machine, 3 % of a core over a 15 s window), a start-up cost, not the steady state measured here.
    time.sleep(FLUSH_S + 1.5)
    t0 = time.monotonic()
    before = {k: cpu_ns(p.pid) for k, p in procs.items()}
    time.sleep(seconds)
    after = {k: cpu_ns(p.pid) for k, p in procs.items()}
    wall = time.monotonic() - t0
    rows = []
    for (tool, interval), p in sorted(procs.items(), key=lambda kv: (kv[0][1], not kv[0][0].startswith("stallwatch"))):
        used_ms = (after[(tool, interval)] - before[(tool, interval)]) / 1e6
        snaps = wall * 1000 / interval
        rows.append([f"{interval} ms", tool, f"{used_ms:.1f}", f"{snaps:.0f}", f"{used_ms * 1000 / snaps:.0f}",
                     f"{100 * used_ms / (wall * 1000):.3f} %"])
    for (tool, _), p in procs.items():
        if p.stdin is not None:
            p.stdin.close()
        else:
            p.terminate()
    for p in procs.values():
        p.wait(timeout=60)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each sampler process runs")
    parser.add_argument("--snapshots", type=int, default=3000, help="in-process snapshots per sampler")
    parser.add_argument("--before", help="the src/ folder of an earlier checkout, run side by side at 500 ms")
    args = parser.parse_args()
    job = start_job(workers=2)
    try:
        costs = per_snapshot(args.snapshots, job.pid)
        rows = []
        for tool, xs in costs.items():
            xs_sorted = sorted(xs)
            rows.append([tool, f"{statistics.mean(xs):.0f}", f"{statistics.median(xs):.0f}",
                         f"{xs_sorted[int(0.95 * len(xs)) - 1]:.0f}"])
        print(f"Per snapshot, in process ({args.snapshots} snapshots, job of 3 processes; {machine()})")
        print(table(["sampler", "mean µs", "p50 µs", "p95 µs"], rows))
        print()
        with tempfile.TemporaryDirectory() as tmp:
            rows = process_cost(args.seconds, job.pid, Path(tmp), args.before)
        print(f"Sampler process, {args.seconds:.0f} s each, all running side by side "
              "(CPU from /proc/<pid>/task/*/schedstat, includes writing)")
        print(table(["interval", "sampler", "CPU ms", "snapshots", "µs/snapshot", "% of one core"], rows))
    finally:
        stop_job(job)


if __name__ == "__main__":
    main()
