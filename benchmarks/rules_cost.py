"""Rules: the cost of all eleven built-in rules over one node-day at 100 ms (16 cores, 8 GPUs, 8 ranks of
framework events), read from the store, side by side with what a non-incremental design would pay live.

Targets (issue 4):
  batch  read_run(open_run(path), builtin_rules()) + evaluate(builtin_rules(), [chunk]) <= 5 s and <= 1 GB peak RSS;
  live   the latest 10 s given to rules that already consumed the day: update() + result() of every rule
         <= 50 ms (baseline: evaluating the whole history again from scratch).

The node-day is generated once and written with the store's own writers (SystemWriter, FrameworkWriter):
864,000 snapshots of 102 series (per-core CPU and I/O wait, memory, disk, network, 7 series per GPU, the
job's processes) and ~1.4 M steps (8 ranks, ~0.5 s steps with data_wait/forward/backward/optimizer, an
evaluation pass and data-loader iterators every hour). It is kept in --data DIR and reused.

Every measurement runs in a fresh Python process; peak memory is that process's VmHWM (peak RSS, all of it:
interpreter, numpy and pyarrow included). Live: the rules are fed the day (as one chunk, and as 8640 chunks
of 10 s like a follower), then each of the next 10 s chunks is timed: update() of all, then result() of all.

Besides the shipped path, experiments written here (never in the package) show what a change would save,
each checked to give byte-identical results: A reads only the columns the rules use and skips the sorted
copy; B also reads and feeds the day an hour at a time; C adds a per-rank framework read and one shared,
sort-free FrameworkColumns (patched in for that process); D is C an hour at a time.
Run: python benchmarks/rules_cost.py [--data DIR] [--repeat 3] [--experiments] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, table  # noqa: E402

from stallwatch import records as r  # noqa: E402
from stallwatch.records import FrameworkEvent, MetricKey  # noqa: E402

T0 = 1_763_790_000_000_000  # 2025-11-22T05:40:00Z
S = 1_000_000
DAY_S = 86_400
INTERVAL_MS = 100
CORES, GPUS, RANKS = 16, 8, 8
NODE = "algo-1"
FORMAT = 1  # bump when the generated data changes: a cached data set of another format is regenerated
LIVE_S = 10
LIVE_STEPS = 6  # successive live evaluations timed (each gets the next 10 s)

# What the built-in rules read of a node's snapshots (metric names: system_wide(metrics=) filters by them).
RULE_METRICS = (r.CPU_UTIL, r.CPU_IOWAIT, r.MEM_UTIL, r.NET_RX_BPS, r.NET_TX_BPS, r.DISK_READ_BPS,
                r.DISK_WRITE_BPS, r.GPU_UTIL, r.GPU_MEM_UTIL, r.WORKERS_ALIVE)

GB = 1e9
MB = 1e6


# --------------------------------------------------------------------------------------------------
# The generated node-day


def system_keys() -> list[MetricKey]:
    keys = [MetricKey("cpu", r.CPU_UTIL), MetricKey("cpu", r.CPU_IOWAIT)]
    for i in range(CORES):
        keys += [MetricKey(f"cpu{i}", r.CPU_UTIL), MetricKey(f"cpu{i}", r.CPU_IOWAIT)]
    keys += [MetricKey("memory", r.MEM_UTIL), MetricKey("memory", r.MEM_USED_BYTES),
             MetricKey("disk", r.DISK_READ_BPS), MetricKey("disk", r.DISK_WRITE_BPS),
             MetricKey("net", r.NET_RX_BPS), MetricKey("net", r.NET_TX_BPS)]
    for g in range(GPUS):
        keys += [MetricKey(f"gpu{g}", m) for m in (r.GPU_UTIL, r.GPU_MEM_UTIL, r.GPU_MEM_USED_BYTES, r.GPU_MEM_BW_UTIL,
                                                   r.GPU_POWER_W, r.GPU_TEMP_C, r.GPU_SM_CLOCK_MHZ)]
    keys += [MetricKey("proc", m) for m in (r.PROC_CPU_UTIL, r.PROC_RSS_BYTES, r.PROC_COUNT, r.WORKERS_ALIVE,
                                            r.WORKERS_BUSY, r.WORKERS_CPU_UTIL)]
    return keys


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
    from stallwatch.store.system_writer import SystemWriter

    t_start = time.perf_counter()
    loc = RunLocation(str(root))
    end_us = T0 + DAY_S * S
    keys = system_keys()
    loc.write_atomic(layout.RUN_JSON, json.dumps({
        "format_version": 1, "run_id": root.name, "created_us": T0, "created_by_node": NODE,
        "command": ["torchrun", "--nproc-per-node", "8", "train.py"], "versions": {"python": "3.11"},
        "config": {"sample_interval_ms": INTERVAL_MS}}).encode())
    # Flushed once per segment: the stored run is the same 10-minute Parquet segments a real one ends with,
    # without writing (and deleting) the 5 s parts a live sampler writes in between.
    w = SystemWriter(loc, NODE, keys, interval_us=INTERVAL_MS * 1000, flush_interval_us=SEGMENT_US,
                     max_bytes=1 << 40)
    signal = _NodeSignal()
    n = DAY_S * 1000 // INTERVAL_MS
    block = SEGMENT_US // (INTERVAL_MS * 1000)
    for lo in range(0, n, block):
        ts, values = signal.block(min(block, n - lo))
        for t, row in zip(ts.tolist(), values):
            w.append(t, row)
            w.tick(t)
    w.close()
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


def peak_rss() -> int:
    """Peak resident memory of this process so far, bytes: VmHWM, the high-water mark of this process's own
    memory (ru_maxrss would also count the parent's image it was forked from, which exec keeps there)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def lean_read_run(run: Any, metrics: tuple[str, ...] | None = RULE_METRICS, framework: bool = False) -> Any:
    """read_run() with two changes a reader could make (an experiment, not the package's code): only the
    columns the rules read (`system_wide(metrics=)`), and no sorted copy of columns already in time order
    (each column goes from Arrow to numpy once, and its Arrow chunks are dropped as soon as it is
    converted)."""
    from stallwatch.analyze.rules.base import Chunk, NodeFrame
    from stallwatch.records import TIMESTAMP

    info = dict(run.info)
    nodes = info.get("nodes", {})
    system = {}
    for node in run.nodes:
        t = run.system_wide(node, metrics=metrics)
        ts = t[TIMESTAMP].to_numpy().astype(np.int64, copy=False)
        order = None if np.all(ts[1:] >= ts[:-1]) else np.argsort(ts, kind="stable")
        cols = {}
        for name in [n for n in t.column_names if n != TIMESTAMP]:
            values = t[name].to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            cols[name] = values if order is None else values[order]
            t = t.drop_columns([name])  # the only reference: its Arrow buffers go now
        system[node] = NodeFrame(node, ts if order is None else ts[order], cols, dict(nodes.get(node) or {}))
        del t
    events = lean_framework(run) if framework else run.framework()
    info["operators"] = run.operators()
    return Chunk(system, events, info, final=True)


def lean_framework(run: Any, lo: int | None = None, hi: int | None = None) -> Any:
    """Run.framework() done differently (an experiment; local runs with segments only): each rank's files in
    one pyarrow.dataset scan instead of a read, a filter, a sort and a copy per file; dictionaries unified so
    every column is one chunk per rank; sorted only when not already in time order. Events starting in
    [lo, hi)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    from stallwatch.records import framework_schema
    from stallwatch.store import layout

    schema = framework_schema()
    found = [c for e in run.location.list(layout.FRAMEWORK_DIR)
             if (c := layout.parse_chunk(e.path, e.size)) is not None and c.rank is not None]
    streams: dict[tuple[str, str], list[Any]] = {}
    for c in layout.live_chunks(found):
        if c.overlaps(lo, hi):
            streams.setdefault((c.node, c.rank), []).append(c)
    tables = []
    for (node, rank), chunks in sorted(streams.items(), key=lambda kv: (kv[0][0], int(kv[0][1]))):
        if any(c.kind != layout.SEGMENT for c in chunks):
            t = run.framework(start_us=lo, end_us=hi, nodes=[node])  # parts: the reader's way
            t = t.filter(pc.equal(t["rank"], int(rank)))
            tables.append(t if lo is None else t.filter(pc.greater_equal(t["start_us"], lo)))
            continue
        t = pads.dataset([os.path.join(run.uri, c.path) for c in chunks], format="parquet").to_table()
        if lo is not None or hi is not None:
            start = t["start_us"]
            keep = pc.and_(pc.greater_equal(start, lo) if lo is not None else pa.scalar(True),
                           pc.less(start, hi) if hi is not None else pa.scalar(True))
            t = t.filter(keep)
        t = t.unify_dictionaries().combine_chunks()
        starts = t["start_us"].to_numpy()
        if not np.all(starts[1:] >= starts[:-1]):
            t = t.take(pa.array(np.argsort(starts, kind="stable")))
        n = t.num_rows
        fixed = {"node": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([node])),
                 "rank": pa.array(np.full(n, int(rank), np.int32))}
        tables.append(pa.Table.from_arrays([fixed[f.name] if f.name in fixed else t[f.name].cast(f.type)
                                            for f in schema], schema=schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def patch_framework_columns() -> None:
    """Three changes to the rules' shared FrameworkColumns, patched in for this process only (an experiment):
    one instance per events table shared by the four framework rules instead of one each; kind_is/mode_is by
    a lookup table instead of np.isin; groups() by counting and a radix (uint16 stable) sort of the small
    group key instead of two np.unique and an int64 argsort. Same groups, same order."""
    from stallwatch.analyze.rules.steps import FrameworkColumns

    if getattr(FrameworkColumns, "_bench_patched", False):
        return
    orig_init, orig_groups = FrameworkColumns.__init__, FrameworkColumns.groups
    last: list[Any] = [None, None]  # (table, instance): the table is held so its id is never reused

    def new(cls: type, table: Any) -> Any:
        if last[0] is table:
            return last[1]
        obj = object.__new__(cls)
        obj._ready = False
        last[0], last[1] = table, obj
        return obj

    def init(self: Any, table: Any) -> None:
        if not self._ready:
            orig_init(self, table)
            self._ready = True

    def lookup(names: list[str], wanted: Any, codes: np.ndarray, n: int) -> np.ndarray:
        lut = np.array([x in wanted for x in names], bool)
        return lut[codes] if lut.size else np.zeros(n, bool)

    def groups(self: Any, mask: np.ndarray, *, by_mode: bool = True) -> list[tuple[tuple, np.ndarray]]:
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return []
        r = self.rank[idx]
        lo, hi = int(r.min()), int(r.max())
        if hi - lo > 4096:
            return orig_groups(self, mask, by_mode=by_mode)
        present = np.flatnonzero(np.bincount(r - lo))
        ranks = present + lo
        dense = np.zeros(hi - lo + 1, np.int64)
        dense[present] = np.arange(len(present))
        nm = max(len(self.modes), 1)
        key = self.node[idx] * len(ranks) + dense[r - lo]
        if by_mode:
            key = key * nm + self.mode[idx]
        if int(key.max()) >= 1 << 16:
            return orig_groups(self, mask, by_mode=by_mode)
        counts = np.bincount(key)
        uniq = np.flatnonzero(counts)
        order = np.argsort(key.astype(np.uint16), kind="stable")
        bounds = np.concatenate([[0], np.cumsum(counts[uniq])])
        out = []
        for g, k in enumerate(uniq.tolist()):
            m = 0
            if by_mode:
                k, m = divmod(k, nm)
            node, rank = divmod(k, len(ranks))
            name = (self.nodes[node], int(ranks[rank])) + ((self.modes[m],) if by_mode else ())
            out.append((name, idx[order[bounds[g]:bounds[g + 1]]]))
        return out

    FrameworkColumns.__new__ = new  # type: ignore[method-assign]
    FrameworkColumns.__init__ = init  # type: ignore[method-assign]
    FrameworkColumns.kind_is = lambda self, *kinds: lookup(self.kinds, kinds, self.kind, self.n)  # type: ignore
    FrameworkColumns.mode_is = lambda self, modes: lookup(self.modes, set(modes), self.mode, self.n)  # type: ignore
    FrameworkColumns.groups = groups  # type: ignore[method-assign]
    FrameworkColumns._bench_patched = True  # type: ignore[attr-defined]


def frame_bytes(chunk: Any) -> tuple[int, int]:
    system = sum(f.timestamps.nbytes + sum(v.nbytes for v in f.columns.values()) for f in chunk.system.values())
    return system, chunk.framework.nbytes


def child_batch(path: str, lean: bool, whatif: bool = False) -> dict[str, Any]:
    from stallwatch.analyze.rules.feed import read_run
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.analyze.rules.runner import evaluate
    from stallwatch.store.reader import open_run

    if whatif:
        patch_framework_columns()
    rss0 = peak_rss()
    c0 = time.process_time()
    t0 = time.perf_counter()
    chunk = lean_read_run(open_run(path), framework=whatif) if lean else read_run(open_run(path), builtin_rules())
    t1 = time.perf_counter()
    rss_read = peak_rss()
    results = evaluate(builtin_rules(), [chunk])
    t2 = time.perf_counter()
    cpu_s = time.process_time() - c0
    system_b, events_b = frame_bytes(chunk)
    return {"read_s": t1 - t0, "eval_s": t2 - t1, "total_s": t2 - t0, "cpu_s": cpu_s, "load": os.getloadavg()[0],
            "rss_start": rss0, "rss_read": rss_read,
            "rss_peak": peak_rss(), "system_bytes": system_b, "events_bytes": events_b,
            "columns": sum(len(f.columns) for f in chunk.system.values()), "events": chunk.framework.num_rows,
            "results": {x.name: [x.status, x.triggered, x.violations, x.datapoints] for x in results},
            "digest": digest(results)}


def digest(results: list[Any]) -> str:
    """A fingerprint of the results' JSON (the same data must give the same results, however it was read)."""
    import hashlib

    from stallwatch.analyze.rules.runner import _plain

    text = json.dumps([x.to_json() for x in results], sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def child_stream(path: str, hours: float, metrics: tuple[str, ...] | None, whatif: bool = False) -> dict[str, Any]:
    """The same evaluation with the run read a slice of time at a time (`hours` per chunk; snapshots in
    [lo, hi), events starting in [lo, hi)), every rule fed each chunk as it is read: memory then holds
    one slice of data plus what the rules keep, not the whole day."""
    import pyarrow.compute as pc

    from stallwatch.analyze.rules.base import Chunk
    from stallwatch.analyze.rules.feed import node_frame
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.store.reader import open_run

    if whatif:
        patch_framework_columns()
    rss0 = peak_rss()
    c0 = time.process_time()
    t0 = time.perf_counter()
    run = open_run(path)
    info = dict(run.info)
    info["operators"] = run.operators()
    nodes = run.nodes
    start, end = int(info["start_us"]), int(info["end_us"]) + 1
    step = int(hours * 3600 * S)
    edges = list(range(start, end, step)) + [end]
    rules = [cls() for cls in builtin_rules()]
    read_s = 0.0
    for i in range(len(edges) - 1):
        lo, hi = edges[i], edges[i + 1]
        a = time.perf_counter()
        system = {n: node_frame(n, run.system_wide(n, start_us=lo, end_us=hi, metrics=metrics), info["nodes"].get(n))
                  for n in nodes}
        if whatif:
            events = lean_framework(run, lo, hi)
        else:
            events = run.framework(start_us=lo, end_us=hi)
            if events.num_rows:  # overlapping events were read by the slice before: keep those starting here
                events = events.filter(pc.greater_equal(events["start_us"], lo))
        read_s += time.perf_counter() - a
        chunk = Chunk(system, events, info, final=i == len(edges) - 2)
        for rule in rules:
            rule.update(chunk)
        del chunk, system, events
    results = [rule.result() for rule in rules]
    t2 = time.perf_counter()
    return {"read_s": read_s, "eval_s": t2 - t0 - read_s, "total_s": t2 - t0, "cpu_s": time.process_time() - c0,
            "load": os.getloadavg()[0], "rss_start": rss0, "rss_peak": peak_rss(), "chunks": len(edges) - 1,
            "results": {x.name: [x.status, x.triggered, x.violations, x.datapoints] for x in results},
            "digest": digest(results)}


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
    from stallwatch.analyze.rules.feed import read_run
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.analyze.rules.runner import evaluate
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
    from stallwatch.analyze.rules.feed import node_frame
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
    """Where the batch time and memory go: each step of read_run timed (with Arrow's allocation and the
    process RSS after it), then each rule's update()+result() timed, then its peak Python/numpy memory
    (tracemalloc, a second pass: tracing slows the first down)."""
    import tracemalloc

    import pyarrow as pa

    from stallwatch.analyze.rules.base import Chunk
    from stallwatch.analyze.rules.feed import node_frame
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.store.reader import open_run

    steps = []

    def mark(what: str, t0: float) -> float:
        now = time.perf_counter()
        steps.append([what, now - t0, pa.total_allocated_bytes(), current_rss(), peak_rss()])
        return now

    t = time.perf_counter()
    run = open_run(path)
    info = dict(run.info)
    nodes = run.nodes
    t = mark("open_run + info + nodes", t)
    tables = {n: run.system_wide(n) for n in nodes}
    t = mark("system_wide (Parquet -> Arrow)", t)
    system = {n: node_frame(n, tables[n], info["nodes"].get(n)) for n in nodes}
    t = mark("node_frame (Arrow -> numpy, sorted copy)", t)
    del tables
    t = mark("drop the Arrow tables", t)
    events = run.framework()
    t = mark("framework (Parquet -> Arrow events)", t)
    info["operators"] = run.operators()
    t = mark("operators", t)
    chunk = Chunk(system, events, info, final=True)
    rules = []
    for cls in builtin_rules():
        rule = cls()
        a = time.perf_counter()
        rule.update(chunk)
        b = time.perf_counter()
        rule.result()
        c = time.perf_counter()
        rules.append([cls.name, b - a, c - b])
    tracemalloc.start()
    for row, cls in zip(rules, builtin_rules()):
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        rule = cls()
        rule.update(chunk)
        rule.result()
        kept = tracemalloc.get_traced_memory()[0] - base
        row += [tracemalloc.get_traced_memory()[1] - base, kept]
        del rule
    tracemalloc.stop()
    return {"read": steps, "rules": rules, "columns": sum(len(f.columns) for f in system.values()),
            "events": events.num_rows, "events_bytes": events.nbytes}


def child_profile(path: str, out: str) -> dict[str, Any]:
    import cProfile
    import pstats

    from stallwatch.analyze.rules.feed import read_run
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.analyze.rules.runner import evaluate
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


def child_experiments(path: str) -> list[list[Any]]:
    """Measurements behind the suggestions (first run and best of 2): the alternatives, side by side."""
    import glob

    import pyarrow.dataset as pads

    from stallwatch.analyze.rules.steps import FrameworkColumns
    from stallwatch.store.reader import open_run

    rows: list[list[Any]] = []

    def best(label: str, fn: Any, n: int = 2) -> Any:
        out, times = None, []
        for _ in range(n):
            a = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - a)
        rows.append([label, times[0], min(times)])
        return out

    run = open_run(path)
    files = sorted(glob.glob(f"{path}/framework/*/*/seg-*.parquet"))
    ev = best("Run.framework(): 1152 files, to_events, a sort and a copy per file", run.framework)
    best("alt: the same files read by one pyarrow.dataset scan",
         lambda: pads.dataset(files, format="parquet").to_table())
    cols = best("FrameworkColumns(events) (built by 4 rules, once each)", lambda: FrameworkColumns(ev))
    combined = best("alt: events.unify_dictionaries().combine_chunks()",
                    lambda: ev.unify_dictionaries().combine_chunks())
    best("alt: FrameworkColumns(combined events)", lambda: FrameworkColumns(combined))
    best("kind_is('step'): np.isin over int64 codes", lambda: cols.kind_is("step"))
    lut = np.array([k == "step" for k in cols.kinds])
    best("alt: the same by a lookup table (lut[codes])", lambda: lut[cols.kind])
    other = ~cols.kind_is("step")
    best("groups(non-step events): two np.unique + a stable argsort", lambda: cols.groups(other))

    def runs() -> list[np.ndarray]:  # events come ordered by node and rank already: cut where the key changes
        idx = np.flatnonzero(other)
        key = cols.node[idx] * (1 << 32) + cols.rank[idx]
        b = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
        return [idx[b[i]:b[i + 1]] for i in range(len(b) - 1)]

    best("alt: the same groups cut where (node, rank) changes (no sort)", runs)
    rng = np.random.default_rng(0)
    x = np.round(np.clip(rng.normal(55, 15, DAY_S * 10), 0, 100), 2).astype(np.float32)
    best("box_stats percentiles of one day-long series (864k float32)",
         lambda: np.percentile(x.astype(np.float64), [25, 50, 75, 95]), n=5)
    counts = np.bincount(np.rint(x.astype(np.float64) * 100).astype(np.int64), minlength=10_001)

    def from_counts() -> np.ndarray:  # numpy's linear percentiles, exactly, from counts at the stored 0.01
        cum = np.cumsum(counts)
        pos = np.array([25, 50, 75, 95]) / 100 * (cum[-1] - 1)
        k = np.floor(pos).astype(np.int64)
        a, b = np.searchsorted(cum, k, side="right"), np.searchsorted(cum, k + 1, side="right")
        return (a + (b - a) * (pos - k)) / 100

    got = best("alt: the same from a 10,001-bin count histogram (values are stored at 0.01 %)", from_counts, n=5)
    ref = np.percentile(x.astype(np.float64), [25, 50, 75, 95])
    diff = float(np.abs(got - ref).max())
    rows.append([f"alt: largest difference from np.percentile: {diff:.1e} (rules round to 4 digits)", None, None])
    return rows


def child(args: argparse.Namespace) -> None:
    path = str(Path(args.data) / "run")
    if args.child == "batch":
        out = child_batch(path, lean=False)
    elif args.child == "lean":
        out = child_batch(path, lean=True)
    elif args.child == "whatif":
        out = child_batch(path, lean=True, whatif=True)
    elif args.child == "whatif-stream":
        out = child_stream(path, args.hours, RULE_METRICS, whatif=True)
    elif args.child == "stream":
        out = child_stream(path, args.hours, None)
    elif args.child == "stream-lean":
        out = child_stream(path, args.hours, RULE_METRICS)
    elif args.child == "experiments":
        out = child_experiments(path)
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
    p.add_argument("--hours", type=float, default=1.0, help="streamed variant: hours of data per chunk")
    p.add_argument("--profile", action="store_true", help="also cProfile the batch evaluation")
    p.add_argument("--experiments", action="store_true", help="also time the alternatives behind the suggestions")
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

    # (mode, label): the shipped path first, then the experiments (benchmark-side code, same results)
    variants = [("batch", "batch: read_run + evaluate (as shipped)"),
                ("lean", "exp A: read only the rules' columns, no sorted copy"),
                ("stream-lean", f"exp B: A, read and fed {args.hours:g} h at a time"),
                ("whatif", "exp C: A + framework read per rank + shared FrameworkColumns"),
                ("whatif-stream", f"exp D: C, read and fed {args.hours:g} h at a time")]
    runs = {mode: [spawn(data, mode, "--hours", str(args.hours)) for _ in range(args.repeat)] for mode, _ in variants}
    live1 = spawn(data, "live", "--history-chunks", "1")
    liven = spawn(data, "live", "--history-chunks", str(args.history_chunks)) if args.history_chunks > 1 else None
    live_read = spawn(data, "live-read")
    breakdown = spawn(data, "breakdown")

    def med(xs: list[dict[str, Any]], key: str) -> float:
        return float(np.median([x[key] for x in xs]))

    def peak(xs: list[dict[str, Any]], key: str = "rss_peak") -> int:
        return max(x[key] for x in xs)

    batch = runs["batch"]
    rows = [["batch: read_run (store -> chunk)", _s(med(batch, "read_s")), _mem(peak(batch, "rss_read")), "", ""],
            ["batch: evaluate 11 rules", _s(med(batch, "eval_s")), "", "", ""]]
    for mode, label in variants:
        total, top = med(runs[mode], "total_s"), peak(runs[mode])
        rows.append([label, _s(total), _mem(top), "<= 5 s, <= 1 GB", _ok(total <= 5 and top <= GB)])
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
    rows.append(["baseline: read + evaluate the whole history", _s(med(batch, "total_s")), _mem(peak(batch)),
                 "(per 10 s)", ""])
    rows.append(["info: read the latest 10 s from the store", _s(live_read["10s"]["s"]), "", "", ""])
    rows.append(["info: ... with 600 s of events re-read", _s(live_read["10s+600s"]["s"]), "", "", ""])
    print(f"\nRules over one node-day at {INTERVAL_MS} ms ({machine()}; times: median of {args.repeat} fresh "
          f"processes, memory: peak RSS of the process; live: median (max) of {LIVE_STEPS} successive 10 s)")
    print(table(["what", "time", "peak memory", "target", "met?"], rows))

    x, lean = batch[0], runs["lean"][0]
    print(f"\nchunk in memory: system {x['system_bytes'] / MB:.0f} MB ({x['columns']} float32 columns), framework "
          f"events {x['events_bytes'] / MB:.0f} MB ({x['events']:,} rows); process RSS before reading "
          f"{x['rss_start'] / MB:.0f} MB. Exp A: {lean['columns']} columns, system {lean['system_bytes'] / MB:.0f} MB")
    print("each run: read / evaluate / peak RSS; CPU time of the process; 1-min load average at its end")
    for mode, label in variants:
        print(f"  {label.strip()}: " + "; ".join(
            f"{_s(b['read_s'])} / {_s(b['eval_s'])} / {_mem(b['rss_peak'])}, CPU {_s(b['cpu_s'])}, load {b['load']:.1f}"
            for b in runs[mode]))
    same = len({b["digest"] for xs in runs.values() for b in xs}) == 1
    print(f"results: identical (JSON digest) in every variant: {same}; statuses: "
          + ", ".join(f"{k}={v[0]}({v[1]})" for k, v in batch[0]["results"].items()))
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

    print("\nWhere batch reading goes (time, Arrow allocated, RSS, peak RSS after each step):")
    print(table(["step", "time", "Arrow", "RSS", "peak RSS"],
                [[w, _s(t), _mem(a), _mem(c), _mem(m)] for w, t, a, c, m in breakdown["read"]]))
    print("\nWhere batch evaluation goes (per rule; memory: tracemalloc, numpy included, Arrow not):")
    print(table(["rule", "update", "result", "peak extra", "kept"],
                [[n, _s(u), _s(rs), _mem(pk), _mem(kept)] for n, u, rs, pk, kept in breakdown["rules"]]))
    if args.experiments:
        exp = spawn(data, "experiments")
        print("\nAlternatives behind the suggestions (time of the first run, best of 2):")
        print(table(["what", "first", "best"], [[w, "" if a is None else _s(a), "" if b is None else _s(b)]
                                                for w, a, b in exp]))
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
