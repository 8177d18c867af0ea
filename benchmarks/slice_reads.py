"""What the rules' feed pays to read one node's slices as the run grows in nodes: the first node's first --slices
slices (`analyze/judge/feed.read_slice`, as `stallwatch rules` reads them), timed on each run given, with this code
and with `--baseline` (the `src` folder of another checkout), each in a fresh process. Linear time needs the seconds per
slice to stay flat from a run of 8 nodes to one of 64.

Run: python benchmarks/slice_reads.py --runs RUN_8_NODES RUN_64_NODES [--baseline OTHER_CHECKOUT/src] [--slices 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def measure(run_dir: str, slices: int) -> dict:
    """In this process: seconds to read the first node's first `slices` slices, and the events read."""
    try:
        from stallwatch.analyze.judge.feed import plan, read_slice
    except ImportError:  # a baseline tree from before analyze/judge/
        from stallwatch.analyze.rules.feed import plan, read_slice  # type: ignore[no-redef]
    from stallwatch.store.reader import open_run

    run = open_run(run_dir).pinned()
    nodes = (run.info or {}).get("nodes", {})
    planned = plan(run)
    node = planned[0][0]
    mine = [p for p in planned if p[0] == node][:slices]
    t, events = time.perf_counter(), 0
    for _, a, b in mine:
        run, _, table = read_slice(run, node, a, b, set(), nodes)
        events += table.num_rows
    return {"s": time.perf_counter() - t, "slices": len(mine), "events": events, "nodes": len(run.nodes),
            "files": len(run.framework_files())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--baseline")
    ap.add_argument("--slices", type=int, default=30)
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a run: one measurement, in this process
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, a.slices)))
        return
    trees = {"this": str(SRC)} | ({"baseline": a.baseline} if a.baseline else {})
    print("| run | nodes | framework files | code | slices | events | seconds | ms per slice |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for run in a.runs:
        for name, src in trees.items():
            proc = subprocess.run([sys.executable, __file__, "--runs", run, "--slices", str(a.slices), "--child", run],
                                  env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"| {Path(run).parent.name or run} | {r['nodes']} | {r['files']:,} | {name} | {r['slices']} | "
                  f"{r['events']:,} | {r['s']:.2f} | {1000 * r['s'] / max(r['slices'], 1):.0f} |", flush=True)


if __name__ == "__main__":
    main()
