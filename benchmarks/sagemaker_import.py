"""`stallwatch import-sagemaker` on large SageMaker system-metric output: time and peak memory per GB, and the
size of the source and of the run.

    python benchmarks/sagemaker_import.py --gb 0.5 2 5 [--interval-ms 500] [--cores 96] [--gpus 8]

For each size, one node's SageMaker system output of that size is generated in SageMaker's format
(system/incremental/<YYYYMMDDHH>/<minute>.algo-1.json, one JSON line per value: every core's CPU and I/O wait,
every GPU's utilization and memory, memory, three I/O and four network values per round, the kinds a few
ms apart as SageMaker's monitor wrote them; values a random walk with two decimals). At 500 ms, 96 cores and
8 GPUs a node-day is about 4.5 GB. The import runs in a fresh process; its peak RSS is the process's maximum
resident set. Baseline, side by side: the way SageMaker's reader held the data — every line parsed with
json.loads into an event object kept in memory — on the smallest size only (it grows with the input)."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, table  # noqa: E402

T0_S = 1_700_000_000  # a whole minute


def generate(root: Path, target_bytes: int, interval_ms: int, cores: int, gpus: int, seed: int = 1) -> tuple[int, int]:
    """SageMaker-format minute files until `target_bytes`; returns (bytes, rounds)."""
    rng = random.Random(seed)
    cpu = [rng.uniform(5, 95) for _ in range(cores)]
    gpu = [rng.uniform(5, 95) for _ in range(gpus)]
    written = rounds = 0
    per_minute = 60_000 // interval_ms
    minute = T0_S
    while written < target_bytes:
        lines: list[str] = []
        for k in range(per_minute):
            t = minute + k * interval_ms / 1000
            for i in range(cores):
                cpu[i] = min(100.0, max(0.0, cpu[i] + rng.uniform(-5, 5)))
            for g in range(gpus):
                gpu[g] = min(100.0, max(0.0, gpu[g] + rng.uniform(-5, 5)))
            ts = f"{t:.7f}"
            lines += [f'{{"Type":"i/o","Name":"{n}","Dimension":"","Value":{rng.uniform(0, 1e8):.2f},"NodeId":"algo-1",'
                      f'"Timestamp":{ts}}}' for n in ("IOPS", "ReadThroughputInBytesPerSecond",
                                                       "WriteThroughputInBytesPerSecond")]
            tc = f"{t + 0.0001:.7f}"
            for i in range(cores):
                lines.append(f'{{"Type":"cpu","Name":"cpu{i}","Dimension":"CPUUtilization","Value":{cpu[i]:.2f},'
                             f'"NodeId":"algo-1","Timestamp":{tc}}}')
                lines.append(f'{{"Type":"cpu","Name":"cpu{i}","Dimension":"I/OWaitPercentage",'
                             f'"Value":{cpu[i] / 20:.2f},"NodeId":"algo-1","Timestamp":{tc}}}')
            lines.append(f'{{"Type":"memory","Name":"MemoryUsedPercent","Dimension":"","Value":{rng.uniform(20, 30):.2f},'
                         f'"NodeId":"algo-1","Timestamp":{t + 0.0002:.7f}}}')
            tg = f"{t + 0.002:.7f}"
            for g in range(gpus):
                lines.append(f'{{"Type":"gpu","Name":"gpu{g}","Dimension":"GPUUtilization","Value":{gpu[g]:.2f},'
                             f'"NodeId":"algo-1","Timestamp":{tg}}}')
                lines.append(f'{{"Type":"gpu","Name":"gpu{g}","Dimension":"GPUMemoryUtilization",'
                             f'"Value":{gpu[g] / 2:.2f},"NodeId":"algo-1","Timestamp":{tg}}}')
            tn = f"{t + 0.0045:.7f}"
            for dim in ("Algorithm", "Platform"):
                for n in ("ReceiveBytesPerSecond", "TransmitBytesPerSecond"):
                    lines.append(f'{{"Type":"network","Name":"{n}","Dimension":"{dim}",'
                                 f'"Value":{rng.uniform(0, 1e8):.2f},"NodeId":"algo-1","Timestamp":{tn}}}')
            rounds += 1
        hour = datetime.fromtimestamp(minute, timezone.utc).strftime("%Y%m%d%H")
        path = root / "system" / "incremental" / hour / f"{minute}.algo-1.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = ("\n".join(lines) + "\n").encode()
        path.write_bytes(data)
        written += len(data)
        minute += 60
    return written, rounds


_IMPORT = """
import json, resource, sys, time
from stallwatch.importers.sagemaker.importer import import_sagemaker
t = time.perf_counter()
s = import_sagemaker(sys.argv[1], sys.argv[2])
print(json.dumps({"s": time.perf_counter() - t, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "snapshots": sum(n.snapshots for n in s.nodes.values()), "values": sum(n.lines for n in s.nodes.values()),
                  "run_bytes": s.run_bytes, "source_bytes": s.source_bytes}))
"""

_NAIVE = """
import glob, json, resource, sys, time
class Event:
    __slots__ = ("type", "name", "dimension", "value", "node", "timestamp")
    def __init__(self, d):
        self.type, self.name, self.dimension = d["Type"], d.get("Name"), d["Dimension"]
        self.value, self.node, self.timestamp = d["Value"], d["NodeId"], d["Timestamp"]
t = time.perf_counter()
events = []
for path in sorted(glob.glob(sys.argv[1] + "/system/*/*/*.json")):
    with open(path) as fh:
        for line in fh:
            events.append(Event(json.loads(line)))
print(json.dumps({"s": time.perf_counter() - t, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "values": len(events)}))
"""


def _child(code: str, *args: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, nargs="+", default=[0.5, 2.0], help="source sizes in GB (default 0.5 2)")
    p.add_argument("--interval-ms", type=int, default=500)
    p.add_argument("--cores", type=int, default=96)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    args = p.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="sm-import-"))
    rows = []
    try:
        for i, gb in enumerate(sorted(args.gb)):
            src, out = work / f"src-{gb}", work / f"run-{gb}"
            shutil.rmtree(src, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            size, rounds = generate(src, int(gb * 2**30), args.interval_ms, args.cores, args.gpus)
            hours = rounds * args.interval_ms / 3.6e6
            r = _child(_IMPORT, str(src), str(out))
            g = size / 2**30
            rows.append([f"{g:.2f}", f"{hours:.1f}", "import-sagemaker", f"{r['s']:.1f}", f"{r['s'] / g:.1f}",
                         f"{r['rss'] / 2**20:.0f}", f"{r['run_bytes'] / 2**20:.1f}",
                         f"{size / max(r['run_bytes'], 1):.0f}x", f"{r['snapshots']:,}"])
            if i == 0:
                n = _child(_NAIVE, str(src))
                assert n["values"] == r["values"], (n["values"], r["values"])
                rows.append([f"{g:.2f}", f"{hours:.1f}", "baseline: json.loads, kept", f"{n['s']:.1f}",
                             f"{n['s'] / g:.1f}", f"{n['rss'] / 2**20:.0f}", "-", "-", "-"])
            shutil.rmtree(src, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{machine()}; one node, {args.cores} cores, {args.gpus} GPUs, every {args.interval_ms} ms "
          f"({2 * args.cores + 2 * args.gpus + 8} values per round)")
    print(table(["source GB", "hours", "reader", "s", "s per GB", "peak RSS MB", "run MB", "smaller", "snapshots"],
                rows))


if __name__ == "__main__":
    main()
