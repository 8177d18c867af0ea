"""Helpers shared by the benchmark scripts (not part of the package)."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap


def cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU of all threads of `pid` (schedstat: finer than psutil's 10 ms ticks)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def start_job(workers: int = 2) -> subprocess.Popen:
    """A stand-in training job: a process with forked data-loader-like workers, all idle."""
    code = textwrap.dedent(f"""
        import multiprocessing as mp, time, sys
        def work():
            time.sleep(3600)
        if __name__ == "__main__":
            mp.set_start_method("fork")
            ps = [mp.Process(target=work, daemon=True) for _ in range({workers})]
            [p.start() for p in ps]
            print("up", flush=True)
            time.sleep(3600)
    """)
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert job.stdout is not None and job.stdout.readline().strip() == "up"
    return job


def stop_job(job: subprocess.Popen) -> None:
    """Kill the stand-in job with its workers (they would outlive a plain kill of the parent)."""
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait()


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(headers, widths)), "-|-".join("-" * w for w in widths)]
    lines += [" | ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def machine() -> str:
    return f"{os.cpu_count()} cores, Python {sys.version.split()[0]}"


def system_keys(cores: int, gpus: int) -> list:
    """The series of a generated node, in the sampler's order: total and per-core CPU and I/O wait, memory,
    disk, network, 7 series per GPU, the job's processes."""
    from stallwatch import records as r
    from stallwatch.records import MetricKey

    keys = [MetricKey("cpu", r.CPU_UTIL), MetricKey("cpu", r.CPU_IOWAIT)]
    for i in range(cores):
        keys += [MetricKey(f"cpu{i}", r.CPU_UTIL), MetricKey(f"cpu{i}", r.CPU_IOWAIT)]
    keys += [MetricKey("memory", r.MEM_UTIL), MetricKey("memory", r.MEM_USED_BYTES),
             MetricKey("disk", r.DISK_READ_BPS), MetricKey("disk", r.DISK_WRITE_BPS),
             MetricKey("net", r.NET_RX_BPS), MetricKey("net", r.NET_TX_BPS)]
    for g in range(gpus):
        keys += [MetricKey(f"gpu{g}", m) for m in (r.GPU_UTIL, r.GPU_MEM_UTIL, r.GPU_MEM_USED_BYTES, r.GPU_MEM_BW_UTIL,
                                                   r.GPU_POWER_W, r.GPU_TEMP_C, r.GPU_SM_CLOCK_MHZ)]
    keys += [MetricKey("proc", m) for m in (r.PROC_CPU_UTIL, r.PROC_RSS_BYTES, r.PROC_COUNT, r.WORKERS_ALIVE,
                                            r.WORKERS_BUSY, r.WORKERS_CPU_UTIL)]
    return keys


def peak_rss() -> int:
    """Peak resident memory of this process so far, bytes: VmHWM, the high-water mark of this process's own
    memory (ru_maxrss would also count the parent's image it was forked from, which exec keeps there)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def write_snapshots(loc, node: str, keys: list, signal, snapshots: int, interval_ms: int):
    """A generated node's snapshots through the real SystemWriter, one append per snapshot, flushed once per
    10-minute segment: the stored run has the segments a real one ends with, without the 5 s parts a live
    sampler writes (and deletes) in between. `signal.block(n)` gives (timestamps, rows); returns the closed
    writer (its counts)."""
    from stallwatch.store.chunk_writer import SEGMENT_US
    from stallwatch.store.system_writer import SystemWriter

    w = SystemWriter(loc, node, keys, interval_us=interval_ms * 1000, flush_interval_us=SEGMENT_US,
                     max_bytes=1 << 40)
    block = SEGMENT_US // (interval_ms * 1000)
    for lo in range(0, snapshots, block):
        ts, values = signal.block(min(block, snapshots - lo))
        for t, row in zip(ts.tolist(), values):
            w.append(t, row)
            w.tick(t)
    w.close()
    return w
