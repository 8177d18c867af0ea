"""Rules: the cost of all eleven built-in rules over one node-day at 100 ms (16 cores, 8 GPUs, 8 ranks of
framework events), read from the store, side by side with the designs they replace.

Targets (issue 4):
  batch  evaluate(builtin_rules(), iter_run(open_run(path), builtin_rules())) <= 5 s and <= 1 GB peak RSS
         (baseline: the whole run read into one chunk, then evaluated);
  live   the latest 10 s given to rules that already consumed the day: update() + result() of every rule
         <= 50 ms (baseline: evaluating the whole history again from scratch).

The node-day is generated once and written with the store's own writers (SystemWriter, FrameworkWriter):
864,000 snapshots of 102 series (per-core CPU and I/O wait, memory, disk, network, 7 series per GPU, the
job's processes) and ~1.4 M steps (8 ranks, ~0.5 s steps with data_wait/forward/backward/optimizer, an
evaluation pass and data-loader iterators every hour). It is kept in --data DIR and reused.

Every measurement runs in a fresh Python process; peak memory is that process's VmHWM (peak RSS, all of it:
interpreter, numpy and pyarrow included). Live: the rules are fed the day (as one chunk, and as 8640 chunks
of 10 s like a follower), then each of the next 10 s chunks is timed: update() of all, then result() of all.
All batch variants must give byte-identical results (a JSON digest is compared).
Run: python benchmarks/rules_cost.py [--data DIR] [--repeat 3] [--history-chunks 8640] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, peak_rss, system_keys, table, write_snapshots  # noqa: E402

from stallwatch import records as r  # noqa: E402
from stallwatch.records import FrameworkEvent  # noqa: E402

T0 = 1_763_790_000_000_000  # 2025-11-22T05:40:00Z
S = 1_000_000
DAY_S = 86_400
INTERVAL_MS = 100
CORES, GPUS, RANKS = 16, 8, 8
NODE = "algo-1"
FORMAT = 1  # bump when the generated data changes: a cached data set of another format is regenerated
LIVE_S = 10
LIVE_STEPS = 6  # successive live evaluations timed (each gets the next 10 s)

GB = 1e9
MB = 1e6


# --------------------------------------------------------------------------------------------------
# The generated node-day


class _NodeSignal:
    """A busy training node, block by block (random walks carry over): per-core CPU as noisy random walks,
    GPU utilization with step-time periodicity, data-loader I/O bursts, slowly growing host and GPU memory;
    every hour a 30 s checkpoint (GPUs idle, cores busy writing) and a 60 s evaluation pass."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.i = 0
        self.walk = np.zeros(CORES)
        self.mem = 40.0
        self.gpu_used = np.full(GPUS, 6.0e10)

    def block(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rng
        idx = self.i + np.arange(n)
        self.i += n
        ts = T0 + idx.astype(np.int64) * INTERVAL_MS * 1000 + rng.integers(0, 400, n)
        sec = idx * INTERVAL_MS / 1000.0
        in_hour = sec % 3600
        ckpt = (in_hour >= 1800) & (in_hour < 1830)  # checkpoint: GPUs idle, CPU busy, disk writing
        walk = self.walk + np.cumsum(rng.normal(0, 2, (n, CORES)), axis=0)
        self.walk = walk[-1]
        core_util = np.clip(55 + np.clip(walk * 0.1, -25, 25) + rng.normal(0, 8, (n, CORES)), 0, 100)
        core_util[ckpt] = np.clip(core_util[ckpt] + 40, 0, 100)
        core_io = np.clip(rng.exponential(1.0, (n, CORES)) - 0.8, 0, 100)
        core_io[ckpt] = np.clip(core_io[ckpt] + rng.uniform(20, 70, (int(ckpt.sum()), CORES)), 0, 100)
        cols: list[np.ndarray] = [core_util.mean(axis=1), core_io.mean(axis=1)]
        for i in range(CORES):
            cols += [core_util[:, i], core_io[:, i]]
        mem = self.mem + np.cumsum(rng.normal(0.00001, 0.002, n))
        self.mem = float(mem[-1])
        burst = rng.random(n) < 0.2
        cols += [mem, mem / 100 * 1.1e12,
                 np.where(burst, rng.uniform(1e8, 2e9, n), rng.uniform(0, 1e5, n)),
                 np.where(ckpt, rng.uniform(5e8, 2e9, n),
                          np.where(rng.random(n) < 0.02, rng.uniform(1e6, 5e8, n), 0.0)),
                 rng.uniform(5e7, 2e8, n), rng.uniform(5e7, 2e8, n)]
        phase = np.sin(idx / 7.0)
        for g in range(GPUS):
            util = np.clip(np.round(85 + 10 * phase + rng.normal(0, 6, n)), 0, 100)
            util[ckpt] = np.round(rng.uniform(0, 5, int(ckpt.sum())))
            used = self.gpu_used[g] + np.cumsum(rng.random(n) < 0.001) * 2**21
            self.gpu_used[g] = used[-1]
            cols += [util, 100 * used / 8.5e10, used, np.clip(np.round(util * 0.6 + rng.normal(0, 3, n)), 0, 100),
                     np.round(250 + 100 * phase + rng.normal(0, 15, n), 3),
                     np.round(65 + 3 * phase + rng.normal(0, 0.5, n)),
                     np.where(rng.random(n) < 0.95, 1980.0, 1755.0)]
        workers = np.where(rng.random(n) < 0.98, 16.0, 15.0)  # 8 ranks x num_workers=2
        cols += [core_util.mean(axis=1) * 0.8, 3.2e10 + mem * 1e7, workers + RANKS, workers,
                 np.minimum(workers, np.round(workers * rng.random(n) + 0.5)), core_util.mean(axis=1) * 0.4]
        return ts, np.column_stack(cols)


def _loader_args(rank: int, dataset: str, batch: int, workers: int, pid: int) -> str:
    return json.dumps({"loader_id": 140_000_000 + rank * 16 + (dataset == "Val"), "dataset": dataset,
                       "batch_size": batch, "num_workers": workers, "pin_memory": True, "prefetch_factor": 2,
                       "persistent_workers": False, "drop_last": dataset != "Val", "timeout": 0,
                       "sampler": "DistributedSampler", "multiprocessing_context": "fork",
                       "worker_pids": [pid + 1 + k for k in range(workers)]})


def rank_events(rank: int, end_us: int, seed: int) -> list[FrameworkEvent]:
    """One rank's day as the torch layer records it: after 3 minutes of initialization, per hour a training
    epoch (steps of ~0.5 s: data_wait, forward, backward, optimizer; a slow step now and then) then an
    evaluation pass (steps of ~0.2 s: data_wait, forward); a `dataloader` event when each loop starts."""
    rng = np.random.default_rng(seed)
    pid = 5000 + rank * 100
    ev: list[FrameworkEvent] = []
    t = T0 + 180 * S + int(rng.integers(0, 20_000))
    counts = {r.TRAIN: 0, r.EVAL: 0}
    train_args, eval_args = _loader_args(rank, "ImageNet", 256, 2, pid), _loader_args(rank, "Val", 256, 2, pid)
    while t < end_us:
        for mode, n_steps, args in ((r.TRAIN, 7000, train_args), (r.EVAL, 300, eval_args)):
            ev.append(FrameworkEvent("dataloader", "ImageFolder", t, t, r.GLOBAL, None, pid, args))
            if mode == r.TRAIN:
                dur = (0.5 * S * rng.lognormal(0, 0.04, n_steps)).astype(np.int64)
                slow = rng.random(n_steps) < 0.001
                dur[slow] *= 3
                wait = (dur * 0.02).astype(np.int64)
                wait[slow] = dur[slow] // 2  # a slow step waits for its batch
                fwd = ((dur - wait) * 0.33).astype(np.int64)
                bwd = ((dur - wait) * 0.55).astype(np.int64)
                opt = ((dur - wait) * 0.1).astype(np.int64)
            else:
                dur = (0.2 * S * rng.lognormal(0, 0.05, n_steps)).astype(np.int64)
                wait = (dur * 0.05).astype(np.int64)
                fwd = ((dur - wait) * 0.95).astype(np.int64)
            name = "train_step" if mode == r.TRAIN else "eval_step"
            for k in range(n_steps):
                if t >= end_us:
                    break
                d, w, f = int(dur[k]), int(wait[k]), int(fwd[k])
                step = counts[mode]
                counts[mode] += 1
                ev.append(FrameworkEvent("step", name, t, t + d, mode, step, pid))
                ev.append(FrameworkEvent("data_wait", "next_batch", t, t + w, mode, step, pid))
                ev.append(FrameworkEvent("forward", "ResNet", t + w + 50, t + w + 50 + f, mode, step, pid))
                if mode == r.TRAIN:
                    b0 = t + w + 80 + f
                    b, o = int(bwd[k]), int(opt[k])
                    ev.append(FrameworkEvent("backward", "backward", b0, b0 + b, mode, step, pid))
                    ev.append(FrameworkEvent("optimizer", "AdamW", b0 + b + 20, b0 + b + 20 + o, mode, step, pid))
                t += d + 30
    return ev


def generate(root: Path) -> dict[str, Any]:
    """Write the node-day into `root` (a run directory) with the store's writers; returns a summary."""
    from stallwatch.store import layout
    from stallwatch.store.chunk_writer import SEGMENT_US
    from stallwatch.store.framework_writer import FrameworkWriter
    from stallwatch.store.location import RunLocation

    t_start = time.perf_counter()
    loc = RunLocation(str(root))
    end_us = T0 + DAY_S * S
    keys = system_keys(CORES, GPUS)
    loc.write_atomic(layout.RUN_JSON, json.dumps({
        "format_version": 1, "run_id": root.name, "created_us": T0, "created_by_node": NODE,
        "command": ["torchrun", "--nproc-per-node", "8", "train.py"], "versions": {"python": "3.11"},
        "config": {"sample_interval_ms": INTERVAL_MS}}).encode())
    n = DAY_S * 1000 // INTERVAL_MS
    w = write_snapshots(loc, NODE, keys, _NodeSignal(), n, INTERVAL_MS)
    events = 0
    steps = 0
    for rank in range(RANKS):
        fw = FrameworkWriter(loc, NODE, rank, flush_interval_us=SEGMENT_US, max_bytes=1 << 40)
        for e in rank_events(rank, end_us, seed=100 + rank):
            fw.append(e)
            fw.tick(e.end_us)
            events += 1
            steps += e.kind == "step"
        fw.close()
    record = {"node": NODE, "start_us": T0, "end_us": end_us + S, "command": ["python", "train.py"],
              "cwd": "/work", "status": "finished", "hostname": NODE, "cpu_cores_logical": CORES,
              "cpu_cores_physical": CORES // 2, "memory_total_bytes": 1100 * 10**9,
              "gpus": [{"index": g, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85 * 10**9}
                       for g in range(GPUS)],
              "gpu_driver": "550.54.15", "platform": "Linux", "python": "3.11", "sampler_pid": 4242,
              "metrics": [k.column for k in keys], "sample_interval_ms": INTERVAL_MS, "exit_code": 0,
              "samples_written": w.samples_written, "samples_dropped": w.samples_dropped, "ticks_missed": 0,
              "sampler_end_us": end_us}
    loc.write_atomic(layout.node_json(NODE), json.dumps(record, indent=2, sort_keys=True).encode())
    return {"format": FORMAT, "snapshots": n, "series": len(keys), "events": events, "steps": steps,
            "generate_s": round(time.perf_counter() - t_start, 1)}


def dataset(data: Path) -> tuple[Path, dict[str, Any]]:
    """The run directory, generated unless a complete one of this format is there."""
    run = data / "run"
    marker = data / "complete.json"
    if marker.exists():
        summary = json.loads(marker.read_text())
        if summary.get("format") == FORMAT:
            return run, summary
    if run.exists():
        import shutil

        shutil.rmtree(run)
    data.mkdir(parents=True, exist_ok=True)
    print(f"generating the node-day into {run} (once; reused from --data next time) ...", flush=True)
    summary = generate(run)
    summary["bytes"] = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
    marker.write_text(json.dumps(summary))
    return run, summary


# --------------------------------------------------------------------------------------------------
# Measured parts (each in a fresh process: `--child MODE`)


def child_batch(path: str, mode: str) -> dict[str, Any]:
    """One batch evaluation: "batch" as shipped (iter_run: an hour at a time, read ahead on a thread),
    "serial" (the same, reading and evaluating in turn), "one-chunk" (the baseline: the whole run read into
    one chunk, then evaluated, as before slicing)."""
    from stallwatch.analyze.judge.feed import iter_run, read_run
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.analyze.judge.runner import evaluate
    from stallwatch.store.reader import open_run

    rss0 = peak_rss()
    c0 = time.process_time()
    t0 = time.perf_counter()
    run = open_run(path)
    if mode == "one-chunk":
        chunks: Any = [read_run(run, builtin_rules())]
    else:
        chunks = iter_run(run, builtin_rules(), read_ahead=1 if mode == "batch" else 0)
    results = evaluate(builtin_rules(), chunks)
    total = time.perf_counter() - t0
    return {"total_s": total, "cpu_s": time.process_time() - c0, "load": os.getloadavg()[0], "rss_start": rss0,
            "rss_peak": peak_rss(),
            "results": {x.name: [x.status, x.triggered, x.violations, x.datapoints] for x in results},
            "digest": digest(results)}


def digest(results: list[Any]) -> str:
    """A fingerprint of the results' JSON (the same data must give the same results, however it was read)."""
    import hashlib

    from stallwatch.analyze.judge.runner import _plain

    text = json.dumps([x.to_json() for x in results], sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Slicer:
    """Consecutive time slices of a whole-run chunk as chunks of views (no copies): snapshots by timestamp,
    events by start (one sort of the events up front) — what a live follower hands the rules."""

    def __init__(self, chunk: Any) -> None:
        import pyarrow as pa

        self.chunk = chunk
        ev = chunk.framework
        starts = ev["start_us"].to_numpy()
        order = np.argsort(starts, kind="stable")
        self.events = ev.take(pa.array(order))
        self.starts = starts[order]
        self.ts = {node: f.timestamps for node, f in chunk.system.items()}

    def chunk_between(self, lo: int | None, hi: int | None, final: bool = False) -> Any:
        from stallwatch.analyze.rules.base import Chunk, NodeFrame

        system = {}
        for node, f in self.chunk.system.items():
            a = 0 if lo is None else int(np.searchsorted(f.timestamps, lo))
            b = len(f) if hi is None else int(np.searchsorted(f.timestamps, hi))
            system[node] = NodeFrame(node, f.timestamps[a:b], {k: v[a:b] for k, v in f.columns.items()}, f.info)
        a = 0 if lo is None else int(np.searchsorted(self.starts, lo))
        b = len(self.starts) if hi is None else int(np.searchsorted(self.starts, hi))
        return Chunk(system, self.events.slice(a, b - a), self.chunk.run, final=final)


def child_live(path: str, history_chunks: int) -> dict[str, Any]:
    """Rules fed the day up to the last LIVE_STEPS x 10 s (as one chunk, or as `history_chunks` chunks),
    then given each following 10 s: update() of every rule, then result() of every rule, timed."""
    from stallwatch.analyze.judge.feed import read_run
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.analyze.judge.runner import evaluate
    from stallwatch.store.reader import open_run

    chunk = read_run(open_run(path), builtin_rules())
    sl = _Slicer(chunk)
    last = max(int(f.timestamps[-1]) for f in chunk.system.values())
    cut = last + 1 - LIVE_STEPS * LIVE_S * S
    first = min(int(f.timestamps[0]) for f in chunk.system.values())
    rules = [cls() for cls in builtin_rules()]
    spread: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    if history_chunks <= 1:
        history = sl.chunk_between(None, cut)
        for rule in rules:
            rule.update(history)
        del history
    else:
        edges = np.linspace(first, cut, history_chunks + 1).astype(np.int64)
        edges[0] = first - 1
        per_update = np.zeros((history_chunks, len(rules)))  # every update() of the follower, timed
        for i in range(history_chunks):
            part = sl.chunk_between(int(edges[i]), int(edges[i + 1]))
            for j, rule in enumerate(rules):
                a = time.perf_counter()
                rule.update(part)
                per_update[i, j] = time.perf_counter() - a
        # the second half of the day (the state has grown): how update() costs are spread
        late = per_update[history_chunks // 2:]
        spread = {"all": [float(np.median(late.sum(axis=1))), float(np.percentile(late.sum(axis=1), 99)),
                          float(late.sum(axis=1).max())]}
        for j, rule in enumerate(rules):
            spread[rule.name] = [float(np.median(late[:, j])), float(np.percentile(late[:, j], 99)),
                                 float(late[:, j].max())]
    feed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for rule in rules:
        rule.result()  # a follower has results after catching up; what follows is the steady state
    first_result_s = time.perf_counter() - t0
    steps = []
    for k in range(LIVE_STEPS):
        lo = cut + k * LIVE_S * S
        live = sl.chunk_between(lo, lo + LIVE_S * S)
        t0 = time.perf_counter()
        for rule in rules:
            rule.update(live)
        t1 = time.perf_counter()
        per_rule = {}
        for rule in rules:
            a = time.perf_counter()
            rule.result()
            per_rule[rule.name] = time.perf_counter() - a
        t2 = time.perf_counter()
        steps.append({"update_s": t1 - t0, "result_s": t2 - t1, "total_s": t2 - t0, "result_per_rule": per_rule,
                      "snapshots": sum(len(f) for f in live.system.values()), "events": live.framework.num_rows})
    # Baseline: what a design without incremental state pays for the same answer: everything again.
    whole = sl.chunk_between(None, None)
    t0 = time.perf_counter()
    evaluate(builtin_rules(), [whole])
    scratch_s = time.perf_counter() - t0
    return {"feed_s": feed_s, "first_result_s": first_result_s, "steps": steps, "scratch_s": scratch_s,
            "rss_peak": peak_rss(), "update_spread": spread}


def child_live_read(path: str) -> dict[str, Any]:
    """Informational: reading the latest 10 s back from the finished run (system_wide(start_us=),
    framework(start_us=)), and the 10 minutes of events a follower re-reads to catch late writes."""
    from stallwatch.analyze.judge.feed import node_frame
    from stallwatch.store.reader import open_run

    run = open_run(path)
    end = T0 + DAY_S * S
    out = {}
    for label, lo, events_lo in (("10s", end - LIVE_S * S, end - LIVE_S * S), ("10s+600s", end - LIVE_S * S,
                                                                             end - 600 * S)):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            info = run.info
            frames = {n: node_frame(n, run.system_wide(n, start_us=lo), info["nodes"].get(n)) for n in run.nodes}
            events = run.framework(start_us=events_lo)
            times.append(time.perf_counter() - t0)
        out[label] = {"s": min(times), "snapshots": sum(len(f) for f in frames.values()), "events": events.num_rows}
    return out


def child_breakdown(path: str) -> dict[str, Any]:
    """Where the shipped batch time goes: reading the hourly slices (with the rules' shared framework view),
    then each rule's update() over every slice and its result(), in CPU seconds of this process."""
    from stallwatch.analyze.judge.feed import iter_run
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.store.reader import open_run

    c0 = time.process_time()
    chunks = list(iter_run(open_run(path), builtin_rules(), read_ahead=0))
    read_s = time.process_time() - c0
    rules = []
    for cls in builtin_rules():
        rule = cls()
        a = time.process_time()
        for chunk in chunks:
            rule.update(chunk)
        b = time.process_time()
        rule.result()
        rules.append([cls.name, b - a, time.process_time() - b])
    return {"read_s": read_s, "slices": len(chunks), "rules": rules, "rss_peak": peak_rss()}


def child_profile(path: str, out: str) -> dict[str, Any]:
    import cProfile
    import pstats

    from stallwatch.analyze.judge.feed import read_run
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.analyze.judge.runner import evaluate
    from stallwatch.store.reader import open_run

    prof = cProfile.Profile()
    prof.enable()
    evaluate(builtin_rules(), [read_run(open_run(path), builtin_rules())])
    prof.disable()
    prof.dump_stats(out)
    stats = pstats.Stats(out)
    rows = []
    for (file, line, func), (cc, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append([f"{Path(file).name}:{line}({func})", nc, tt, ct])
    rows.sort(key=lambda x: -x[2])
    return {"tottime": rows[:25], "cumtime": sorted(rows, key=lambda x: -x[3])[:40]}


def child(args: argparse.Namespace) -> None:
    path = str(Path(args.data) / "run")
    if args.child in ("batch", "serial", "one-chunk"):
        out: Any = child_batch(path, args.child)
    elif args.child == "live":
        out = child_live(path, args.history_chunks)
    elif args.child == "live-read":
        out = child_live_read(path)
    elif args.child == "breakdown":
        out = child_breakdown(path)
    else:
        out = child_profile(path, str(Path(args.data) / "batch.prof"))
    print("RESULT " + json.dumps(out))


def spawn(data: Path, mode: str, *extra: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--data", str(data), "--child", mode, *extra],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-4000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


# --------------------------------------------------------------------------------------------------
# The report


def _s(x: float) -> str:
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def _mem(x: float) -> str:
    return f"{x / MB:,.0f} MB"


def _ok(ok: bool) -> str:
    return "yes" if ok else "NO"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "stallwatch-rules-cost"),
                   help="where the generated node-day is kept (reused when present)")
    p.add_argument("--repeat", type=int, default=3, help="fresh processes per batch measurement (median time)")
    p.add_argument("--history-chunks", type=int, default=8640,
                   help="live: the day is also fed as this many chunks (8640: every 10 s, as a follower would)")
    p.add_argument("--profile", action="store_true", help="also cProfile the batch evaluation")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    data = Path(args.data)
    run, summary = dataset(data)
    print(f"node-day: {summary['snapshots']:,} snapshots x {summary['series']} series, {summary['events']:,} "
          f"framework events ({summary['steps']:,} steps, {RANKS} ranks), {summary['bytes'] / MB:.0f} MB on disk "
          f"[{run}]", flush=True)

    # (mode, label): the shipped path first, then the same without reading ahead, then the baseline
    variants = [("batch", "batch: evaluate(rules, iter_run(run)) as shipped (hourly slices, read ahead)"),
                ("serial", "batch: the same, reading and evaluating in turn"),
                ("one-chunk", "baseline: the whole run read into one chunk, then evaluated")]
    runs = {mode: [spawn(data, mode) for _ in range(args.repeat)] for mode, _ in variants}
    live1 = spawn(data, "live", "--history-chunks", "1")
    liven = spawn(data, "live", "--history-chunks", str(args.history_chunks)) if args.history_chunks > 1 else None
    live_read = spawn(data, "live-read")
    breakdown = spawn(data, "breakdown")

    def med(xs: list[dict[str, Any]], key: str) -> float:
        return float(np.median([x[key] for x in xs]))

    def peak(xs: list[dict[str, Any]], key: str = "rss_peak") -> int:
        return max(x[key] for x in xs)

    rows = []
    for mode, label in variants:
        total, top = med(runs[mode], "total_s"), peak(runs[mode])
        target = "<= 5 s, <= 1 GB" if mode == "batch" else ""
        rows.append([label, _s(total), _mem(top), target, _ok(total <= 5 and top <= GB) if target else ""])
    for label, live in (("history as 1 chunk", live1),
                        (f"history as {args.history_chunks} chunks", liven)):
        if live is None:
            continue
        upd = [x["update_s"] for x in live["steps"]]
        tot = [x["total_s"] for x in live["steps"]]
        rows.append([f"live 10 s, {label}: update", f"{_s(float(np.median(upd)))} (max {_s(max(upd))})", "", "", ""])
        rows.append([f"live 10 s, {label}: update + result", f"{_s(float(np.median(tot)))} (max {_s(max(tot))})",
                     _mem(live["rss_peak"]), "<= 50 ms", _ok(max(tot) <= 0.05)])
    rows.append(["baseline: evaluate the whole history again", _s(live1["scratch_s"]), "", "(per 10 s)", ""])
    rows.append(["info: read the latest 10 s back from the store", _s(live_read["10s"]["s"]), "", "", ""])
    print(f"\nRules over one node-day at {INTERVAL_MS} ms ({machine()}; times: median of {args.repeat} fresh "
          f"processes, memory: peak RSS of the process; live: median (max) of {LIVE_STEPS} successive 10 s)")
    print(table(["what", "time", "peak memory", "target", "met?"], rows))

    print("each run: wall / CPU of the process / peak RSS; 1-min load average at its end")
    for mode, label in variants:
        print(f"  {label.strip()}: " + "; ".join(
            f"{_s(b['total_s'])} / CPU {_s(b['cpu_s'])} / {_mem(b['rss_peak'])}, load {b['load']:.1f}"
            for b in runs[mode]))
    same = len({b["digest"] for xs in runs.values() for b in xs}) == 1
    print(f"results: identical (JSON digest) in every variant: {same}; statuses: "
          + ", ".join(f"{k}={v[0]}({v[1]})" for k, v in runs["batch"][0]["results"].items()))
    for label, live in (("1 chunk", live1), (f"{args.history_chunks} chunks", liven)):
        if live is None:
            continue
        last = live["steps"][-1]
        slow = sorted(last["result_per_rule"].items(), key=lambda kv: -kv[1])[:6]
        print(f"live, history as {label}: feeding the history {_s(live['feed_s'])}, first result() of all "
              f"{_s(live['first_result_s'])}; per 10 s: {last['snapshots']} snapshots, {last['events']} events; "
              f"slowest result(): " + ", ".join(f"{k} {_s(v)}" for k, v in slow))
        spread = live.get("update_spread")
        if spread:
            print(f"  update() of every 10 s chunk over the day's second half ({args.history_chunks // 2} chunks), "
                  f"p50 / p99 / max:")
            print(table(["rules", "p50", "p99", "max"], [[k, _s(a), _s(b), _s(c)] for k, (a, b, c) in spread.items()]))

    print(f"\nWhere the batch CPU time goes (serial, CPU seconds): reading {breakdown['slices']} hourly slices with "
          f"the rules' shared framework view {_s(breakdown['read_s'])}, then per rule:")
    print(table(["rule", "update (all slices)", "result"], [[n, _s(u), _s(r)] for n, u, r in breakdown["rules"]]))
    if args.profile:
        prof = spawn(data, "profile")
        print("\ncProfile of batch read + evaluate, by own time (top 25):")
        print(table(["function", "calls", "tottime", "cumtime"],
                    [[f, str(n), f"{tt:.3f}", f"{ct:.3f}"] for f, n, tt, ct in prof["tottime"]]))
        print("\n... by cumulative time (top 40):")
        print(table(["function", "calls", "tottime", "cumtime"],
                    [[f, str(n), f"{tt:.3f}", f"{ct:.3f}"] for f, n, tt, ct in prof["cumtime"]]))


if __name__ == "__main__":
    main()
