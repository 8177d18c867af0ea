"""The Dask engine against the local one on one generated run (benchmarks/report_gen.py, 8 GPUs and 8 ranks a
node, framework events at --steps-per-s per rank): the rules, the per-node step statistics, the timeline export —
each with the local engine, then with a LocalCluster of 1 and 2 worker processes (one thread each). On Dask the rules
are measured both ways: fed node by node on the workers and merged (`analyze/judge/by_node.py`, what
`--engine dask` does),
and fed in the caller the slices the workers read (the way before it, "rules, slices"). Checks that every engine
and way gives identical results, and prints per engine: seconds, speed-up over local, the caller's peak RSS, each
worker's peak RSS, tasks and bytes sent back to the caller.

Run: python benchmarks/scale_dask.py --data DIR [--nodes 8] [--hours 1] [--steps-per-s 10] [--workers 1,2]
     [--jobs rules,slices,steps,timeline]   (slices: the rules also fed the slices in the caller, the old way)
Each engine is measured in a fresh Python process (the caller's VmHWM is its own).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import report_gen  # noqa: E402


def one(run: str, spec: str, workers: int, out: str, jobs: set[str]) -> dict:
    """In this process: the jobs on `spec`; their digests, seconds and the engine's statistics."""
    import gzip
    import hashlib

    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.analyze.engine import open_engine
    from stallwatch.analyze.judge.by_node import evaluate_run
    from stallwatch.analyze.judge.feed import iter_run
    from stallwatch.analyze.judge.runner import evaluate
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.present.trace_export import export_timeline
    from stallwatch.store.reader import open_run

    t0 = time.perf_counter()
    engine = open_engine(spec, **({"workers": workers} if spec == "dask" else {}))
    row: dict = {"engine": spec if spec == "local" else f"dask × {workers}", "start_s": time.perf_counter() - t0}
    try:
        r = open_run(run)
        row.update(rules_s=0.0, slices_s=0.0, steps_s=0.0, timeline_s=0.0)
        if "rules" in jobs:
            caller = _time_the_caller() if spec != "local" else {}
            t = time.perf_counter()
            results = evaluate_run(r, builtin_rules(), engine=engine)
            row["rules_s"] = time.perf_counter() - t
            row["merge_s"], row["final_s"] = caller.get("merge", 0.0), caller.get("final", 0.0)
            row["result_s"] = caller.get("result", 0.0)
            row["rules_tasks"], row["rules_bytes"] = engine.stats.tasks, engine.stats.result_bytes
            row["rules_rss"] = _common.peak_rss()  # the caller's peak so far: the rules fed by node (or locally)
            row["rules_digest"] = _digest(json.dumps([x.to_json() for x in results], sort_keys=True, default=str))
            if spec != "local" and "slices" in jobs:
                t = time.perf_counter()
                results = evaluate(builtin_rules(), iter_run(r, builtin_rules(), engine=engine))
                row["slices_s"] = time.perf_counter() - t
                row["slices_bytes"] = engine.stats.result_bytes - row["rules_bytes"]
                row["slices_digest"] = _digest(json.dumps([x.to_json() for x in results], sort_keys=True,
                                                          default=str))
        if "steps" in jobs:
            t = time.perf_counter()
            stats = RunAnalysis(r, engine=engine).step_stats()
            row["steps_s"] = time.perf_counter() - t
            row["steps_digest"] = _digest(repr(stats))
        if "timeline" in jobs:
            t = time.perf_counter()
            export_timeline(r, out, engine=engine)
            row["timeline_s"] = time.perf_counter() - t
            row["timeline_digest"] = hashlib.sha256(gzip.open(out).read()).hexdigest()[:12]
        row["tasks"] = engine.stats.tasks
        row["bytes"] = engine.stats.result_bytes
        row["workers_rss"] = list(engine.worker_peak_rss().values()) if spec != "local" else []  # type: ignore[attr-defined]
    finally:
        engine.close()
    row["caller_rss"] = _common.peak_rss()
    return row


def _time_the_caller() -> dict[str, float]:
    """Seconds the caller spends merging the workers' rules, feeding the merged rules the final chunk and making
    their results (the serial part of the rules on Dask), summed into the returned dict as the rules run."""
    from stallwatch.analyze.judge import by_node
    from stallwatch.analyze.rules.registry import builtin_rules

    spent = {"merge": 0.0, "final": 0.0, "result": 0.0}
    feed, results_of = by_node.feed, by_node.results_of

    def timed_results(rules, failed):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = results_of(rules, failed)
        spent["result"] += time.perf_counter() - t
        return out

    def timed_feed(rules, chunk, failed):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        feed(rules, chunk, failed)
        if chunk.final:
            spent["final"] += time.perf_counter() - t

    def timed(merge):  # type: ignore[no-untyped-def]
        def run(self, other, node):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            merge(self, other, node)
            spent["merge"] += time.perf_counter() - t
        return run

    by_node.feed = timed_feed  # type: ignore[assignment]
    by_node.results_of = timed_results  # type: ignore[assignment]
    for cls in builtin_rules():
        cls.merge = timed(cls.merge)  # type: ignore[method-assign]
    return spent


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:12]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--steps-per-s", type=float, default=10.0)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--jobs", default="rules,slices,steps,timeline")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # run spec workers: one engine, in this process
    a = ap.parse_args()
    if a.child:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(one(a.child[0], a.child[1], int(a.child[2]), f"{tmp}/t.json.gz", set(a.jobs.split(",")))))
        return
    shape = report_gen.Shape(nodes=a.nodes, hours=a.hours, step_s=1.0 / a.steps_per_s)
    run, summary = report_gen.dataset(a.data / f"n{a.nodes}-h{a.hours:g}-s{a.steps_per_s:g}", shape)
    print(f"{_common.machine()}; {a.nodes} nodes × {a.hours:g} h, {summary['events']:,} events, "
          f"{summary['bytes'] / 1e6:,.0f} MB stored", flush=True)
    rows = []
    for spec, workers in [("local", 0)] + [("dask", int(w)) for w in a.workers.split(",")]:
        proc = subprocess.run([sys.executable, __file__, "--data", str(a.data), "--child", str(run), spec,
                               str(workers), "--jobs", a.jobs], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(proc.stderr[-3000:])
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    base = rows[0]
    digests = [k for k in ("rules_digest", "steps_digest", "timeline_digest") if k in base]
    same = all(r.get(k) == base[k] for r in rows for k in digests)
    same = same and all(r.get("slices_digest", base.get("rules_digest")) == base.get("rules_digest") for r in rows)
    table = []
    for r in rows:
        total = r["rules_s"] + r["steps_s"] + r["timeline_s"]
        base_total = base["rules_s"] + base["steps_s"] + base["timeline_s"]
        table.append([r["engine"], f"{r['start_s']:.1f}", f"{r['rules_s']:.1f}",
                      f"{r['slices_s']:.1f}" if r["slices_s"] else "-", f"{r['steps_s']:.1f}",
                      f"{r['timeline_s']:.1f}", f"{base_total / total:.2f}×", f"{r['caller_rss'] / 1e6:,.0f}",
                      ", ".join(f"{w / 1e6:,.0f}" for w in r["workers_rss"]) or "-", str(r["tasks"]),
                      f"{r['bytes'] / 1e6:,.0f}"])
    print()
    print("the rules on Dask: " + "; ".join(
        f"{r['engine']}: {r['rules_tasks']} tasks, {r['rules_bytes'] / 1e6:,.1f} MB to the caller (the slices' way: "
        f"{r.get('slices_bytes', 0) / 1e6:,.0f} MB), the caller merging {r['merge_s']:.1f} s and feeding the final "
        f"chunk {r['final_s']:.1f} s, their results {r['result_s']:.1f} s, its peak by then "
        f"{r['rules_rss'] / 1e6:,.0f} MB" for r in rows[1:] if "rules_rss" in r))
    print(_common.table(["engine", "start s", "rules s", "rules, slices s", "step stats s", "timeline s",
                         "speed-up (w/o slices)", "caller MB", "workers MB", "tasks", "MB to caller"], table))
    print(f"identical results: {'yes' if same else 'NO'}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
