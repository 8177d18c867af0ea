"""The floor for a sampler process: a loop that wakes on a steady schedule and reads the five /proc files a
snapshot needs (per-core CPU, memory, disks, network, the job's process), splitting them into lines and
nothing else — no parsing, no storing. Run as a process: `python proc_floor.py INTERVAL_MS ROOT_PID`."""

from __future__ import annotations

import select
import sys
import time


def main() -> None:
    interval_s, pid = int(sys.argv[1]) / 1000.0, int(sys.argv[2])
    paths = ["/proc/stat", "/proc/meminfo", "/proc/diskstats", "/proc/net/dev", f"/proc/{pid}/stat"]
    start, k, kept = time.monotonic(), 0, 0
    print("ready", flush=True)
    while True:
        k += 1
        select.select([], [], [], max(0.0, start + k * interval_s - time.monotonic()))
        for path in paths:
            with open(path, "rb", buffering=0) as fh:
                kept += len(fh.read().split(b"\n"))


if __name__ == "__main__":
    main()
