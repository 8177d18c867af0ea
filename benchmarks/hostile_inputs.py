"""Time and peak memory on hostile or huge inputs, each next to what the code did before (the baseline, run
the old way in the same process conditions):

- a gzip-bomb trace.json.gz (1 MB that expands to 1.1 GB; and 3.7 MB of repeated events expanding to 1.1 GB):
  the timeline's check (`Run.trace_size`: counted while decompressing, refused past 1 GB) against loading it
  whole as the export did (`json.loads(gzip.decompress(...))`);
- the sampler's summary of a 400 MB torch.profiler-like trace: streamed (`iter_events` into arrays) against
  `json.load` of the whole trace;
- batch rules over a run whose first segment is named from 1970: the slices `Run.time_slices` reads against
  the hourly grid from the earliest name (the old way: every slice read, here sampled and extrapolated unless
  `--full-baseline`).

Every case runs in a child process (peak RSS is the child's), the baselines under an 8 GB address-space limit
so a bomb cannot take the machine down. Prints a table.

    python benchmarks/hostile_inputs.py [--full-baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib

LIMIT_AS = 8 << 30


def _child(code: str, *args: str) -> dict:
    """Run `code` (which prints one JSON line) in a fresh interpreter; add its peak RSS and wall time."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))

    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _PEAK + textwrap.dedent(code), *args], capture_output=True, text=True,
                       preexec_fn=limit, timeout=3600)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if lines else {"outcome": (p.stderr.strip().splitlines() or ["?"])[-1][:60]}
    out.setdefault("wall_s", wall)
    return out


_PEAK = "import resource; peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"


def bombs(tmp: str) -> list[tuple[str, str, str]]:
    """(name, path) of the two bombs."""
    out = []
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(os.path.join(tmp, "ws.json.gz"), "wb") as fh:
        fh.write(co.compress(b'{"traceEvents": ['))
        for _ in range(1100):
            fh.write(co.compress(b" " * (1 << 20)))
        fh.write(co.compress(b"]}") + co.flush())
    out.append(("whitespace", os.path.join(tmp, "ws.json.gz")))
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    ev = b'{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":1,"dur":1},'
    with open(os.path.join(tmp, "ev.json.gz"), "wb") as fh:
        fh.write(co.compress(b'{"traceEvents": ['))
        for _ in range(1_100_000_000 // len(ev) // 100_000):
            fh.write(co.compress(ev * 100_000))
        fh.write(co.compress(b'{"ph":"i","ts":1}]}') + co.flush())
    out.append(("events", os.path.join(tmp, "ev.json.gz")))
    return out


def bomb_rows(tmp: str) -> list[list[str]]:
    rows = []
    for name, path in bombs(tmp):
        size = os.path.getsize(path)
        ours = _child("""
            import json, sys, time
            from stallwatch.store import trace_codec
            t = time.perf_counter()
            with open(sys.argv[1], "rb") as fh:
                n = trace_codec.json_size(fh, trace_codec.MAX_TRACE_JSON_BYTES)
            refused = n > trace_codec.MAX_TRACE_JSON_BYTES
            print(json.dumps({"wall_s": time.perf_counter() - t, "peak_mb": peak(),
                              "outcome": "refused" if refused else "read"}))
        """, path)
        base = _child("""
            import gzip, json, sys, time
            t = time.perf_counter()
            try:
                doc = json.loads(gzip.decompress(open(sys.argv[1], "rb").read()))
                outcome = f"loaded {len(doc['traceEvents'])} events"
            except MemoryError:
                outcome = "MemoryError at the 8 GB limit"
            print(json.dumps({"wall_s": time.perf_counter() - t, "peak_mb": peak(), "outcome": outcome}))
        """, path)
        rows.append([f"timeline: {name} bomb ({size / 2**20:.1f} MB gz → 1.1 GB)", *_cells(ours), *_cells(base)])
    return rows


def summary_rows(tmp: str, megabytes: int = 400) -> list[list[str]]:
    path = os.path.join(tmp, "trace.json")
    with open(path, "w") as fh:
        fh.write('{"schemaVersion": 1, "traceEvents": [\n')
        i = size = 0
        while size < megabytes << 20:
            line = (f'{{"ph": "X", "cat": "cpu_op", "name": "aten::op{i % 300}", "pid": 1, "tid": 1, "ts": {i * 10},'
                    f' "dur": 8, "args": {{"External id": {i}}}}},\n{{"ph": "X", "cat": "cpu_op", "name": '
                    f'"aten::child{i % 30}", "pid": 1, "tid": 1, "ts": {i * 10 + 1}, "dur": 3, "args": {{}}}},\n')
            fh.write(line)
            size += len(line)
            i += 2
        fh.write('{"ph": "i", "ts": 0, "name": "end"}], "baseTimeNanoseconds": 0}\n')
    ours = _child("""
        import json, sys, time
        from stallwatch.collect.profile_summary import operator_rows
        from stallwatch.store.trace_codec import iter_events
        t = time.perf_counter()
        with open(sys.argv[1], "rb") as fh:
            rows = operator_rows(iter_events(fh, max_bytes=1 << 30))
        print(json.dumps({"wall_s": time.perf_counter() - t, "peak_mb": peak(), "outcome": f"{len(rows)} operators"}))
    """, path)
    base = _child("""
        import json, sys, time
        from stallwatch.collect.profile_summary import operator_rows
        t = time.perf_counter()
        with open(sys.argv[1], "rb") as fh:
            rows = operator_rows(json.load(fh))
        print(json.dumps({"wall_s": time.perf_counter() - t, "peak_mb": peak(), "outcome": f"{len(rows)} operators"}))
    """, path)
    os.unlink(path)
    return [[f"sampler: summary of a {megabytes} MB trace", *_cells(ours), *_cells(base)]]


def slices_rows(tmp: str, full: bool) -> list[list[str]]:
    root = os.path.join(tmp, "run1970")
    code = """
        import json, sys, time
        import numpy as np
        from stallwatch.records import MetricKey
        from stallwatch.store import layout
        from stallwatch.store.location import RunLocation
        from stallwatch.store.system_writer import SystemWriter
        root = sys.argv[1]
        loc = RunLocation(root)
        loc.write_atomic("run.json", json.dumps({"run_id": "run1970"}).encode())
        t0 = 1_763_790_000_000_000
        w = SystemWriter(loc, "n", [MetricKey("cpu", "cpu_util")], interval_us=500_000, flush_interval_us=5_000_000,
                         max_bytes=1 << 30)
        for i in range(7200):  # an hour at 500 ms: 6 segments
            w.append(t0 + i * 500_000, [float(i % 100)])
            w.tick(t0 + i * 500_000)
        w.close()
        import glob, os
        first = sorted(glob.glob(root + "/system/n/seg-*"))[0]
        end = os.path.basename(first).split("-")[2].split(".")[0]
        os.rename(first, os.path.join(os.path.dirname(first), f"seg-{1:016d}-{end}.parquet"))
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(code), root], check=True)
    ours = _child("""
        import json, sys, time
        from stallwatch.analyze.judge.feed import iter_run
        from stallwatch.analyze.rules.registry import builtin_rules
        from stallwatch.analyze.judge.runner import evaluate
        from stallwatch.store.reader import open_run
        import logging; logging.disable(logging.WARNING)
        t = time.perf_counter()
        run = open_run(sys.argv[1])
        rules = builtin_rules()
        evaluate(rules, iter_run(run, rules))
        n = len(run.time_slices(3600 * 1_000_000))
        print(json.dumps({"wall_s": time.perf_counter() - t, "peak_mb": peak(), "outcome": f"{n} slice(s) read"}))
    """, root)
    base = _child("""
        import json, sys, time
        from stallwatch.analyze.judge.feed import node_frame
        from stallwatch.store import layout
        from stallwatch.store.reader import open_run
        import logging; logging.disable(logging.WARNING)
        full = sys.argv[2] == "1"
        run = open_run(sys.argv[1]).pinned()
        # the old grid: from the earliest *name* to the latest, an hour at a time, every slice read
        names = [layout.parse_chunk(e.path, e.size) for e in run.location.list("system")]
        lo, hi = min(c.start_us for c in names if c), max(c.end_us for c in names if c)
        edges = list(range(lo, hi + 1, 3600 * 1_000_000)) + [hi + 1]
        todo = len(edges) - 1 if full else 2000
        t = time.perf_counter()
        for a, b in list(zip(edges[:-1], edges[1:]))[:todo]:
            node_frame("n", run.system_wide("n", start_us=a, end_us=b))
            run.framework(start_us=a, end_us=b, starting=True)
        took = (time.perf_counter() - t) * (len(edges) - 1) / todo
        print(json.dumps({"wall_s": took, "peak_mb": peak(),
                          "outcome": f"{len(edges) - 1} slices" + ("" if full else f" (time from {todo})")}))
    """, root, "1" if full else "0")
    return [["rules: a run with one segment named 1970", *_cells(ours), *_cells(base)]]


def _cells(r: dict) -> list[str]:
    peak = f"{r['peak_mb']:,.0f} MB" if "peak_mb" in r else "?"
    return [f"{r['wall_s']:.2f} s", peak, str(r.get("outcome", ""))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full-baseline", action="store_true",
                    help="run the 1970 baseline over all its ~490k slices (minutes) instead of extrapolating")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sw-hostile-") as tmp:
        rows = bomb_rows(tmp) + summary_rows(tmp) + slices_rows(tmp, args.full_baseline)
    head = ["input", "now: time", "peak", "outcome", "before: time", "peak", "outcome"]
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
