"""A generated multi-node run for the report's benchmarks: by default 8 nodes × 24 h at 500 ms, each with 16 cores,
8 GPUs and 8 ranks of ~0.5 s training steps (data_wait / forward / backward / optimizer) with an evaluation pass
and a 30 s checkpoint every hour, written in the store's own format.

System snapshots go through the real SystemWriter (one append per snapshot, flushed once per 10-minute segment,
as rules_cost.py does). Framework events are many (5 per step: ~55 M for the default size), too many for one
Python `FrameworkWriter.append` each, so each rank's 10-minute segments are written as the writer's `rotate()`
writes them: `framework_codec.encode(SEGMENT, columns)` at `framework_dir(node, rank)/chunk_name(...)`, the same
bytes and names. Planted: the last node is the odd one out (GPUs ~25 points less busy, steps ~25 % slower); a few
slow steps per rank; the hourly checkpoint idles every GPU while cores are busy (CPU-bottleneck moments).

    from report_gen import dataset          # benchmarks/ on sys.path
    run_dir, summary = dataset(Path("/tmp/report-bench"), nodes=8, hours=24)

Run: python benchmarks/report_gen.py --data DIR [--nodes 8] [--hours 24] [--interval-ms 500] [--no-framework]
                                      [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sys

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from stallwatch import records as r  # noqa: E402
from stallwatch.records import MetricKey

T0 = 1_763_790_000_000_000  # 2025-11-22T05:40:00Z
S = 1_000_000
FORMAT = 1  # bump when the generated data changes: a cached data set of another format is regenerated


@dataclass(frozen=True)
class Shape:
    """What to generate."""
    nodes: int = 8
    hours: float = 24.0
    interval_ms: int = 500
    cores: int = 16
    gpus: int = 8
    ranks: int = 8
    step_s: float = 0.5
    framework: bool = True
    seed: int = 0


def system_keys(shape: Shape) -> list[MetricKey]:
    return _common.system_keys(shape.cores, shape.gpus)


class NodeSignal:
    """A busy training node, block by block (random walks carry over): noisy per-core CPU, GPU utilization with
    step periodicity, I/O bursts, slowly growing memory; every hour a 30 s checkpoint (GPUs idle, cores busy,
    disk writing). `gpu_shift` lowers GPU utilization (the odd node)."""

    def __init__(self, shape: Shape, seed: int, gpu_shift: float = 0.0) -> None:
        self.shape = shape
        self.rng = np.random.default_rng(seed)
        self.i = 0
        self.walk = np.zeros(shape.cores)
        self.mem = 40.0
        self.gpu_used = np.full(shape.gpus, 6.0e10)
        self.gpu_shift = gpu_shift

    def block(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        sh, rng = self.shape, self.rng
        idx = self.i + np.arange(n)
        self.i += n
        ts = T0 + idx.astype(np.int64) * sh.interval_ms * 1000 + rng.integers(0, 400, n)
        in_hour = (idx * sh.interval_ms / 1000.0) % 3600
        ckpt = (in_hour >= 1800) & (in_hour < 1830)
        walk = self.walk + np.cumsum(rng.normal(0, 2, (n, sh.cores)), axis=0)
        self.walk = walk[-1]
        core = np.clip(55 + np.clip(walk * 0.1, -25, 25) + rng.normal(0, 8, (n, sh.cores)), 0, 100)
        core[ckpt] = np.clip(core[ckpt] + 40, 0, 100)
        io = np.clip(rng.exponential(1.0, (n, sh.cores)) - 0.8, 0, 100)
        io[ckpt] = np.clip(io[ckpt] + rng.uniform(20, 70, (int(ckpt.sum()), sh.cores)), 0, 100)
        cols: list[np.ndarray] = [core.mean(axis=1), io.mean(axis=1)]
        for i in range(sh.cores):
            cols += [core[:, i], io[:, i]]
        mem = self.mem + np.cumsum(rng.normal(0.00001, 0.002, n))
        self.mem = float(mem[-1])
        burst = rng.random(n) < 0.2
        cols += [mem, mem / 100 * 1.1e12, np.where(burst, rng.uniform(1e8, 2e9, n), rng.uniform(0, 1e5, n)),
                 np.where(ckpt, rng.uniform(5e8, 2e9, n),
                          np.where(rng.random(n) < 0.02, rng.uniform(1e6, 5e8, n), 0.0)),
                 rng.uniform(5e7, 2e8, n), rng.uniform(5e7, 2e8, n)]
        phase = np.sin(idx / 7.0)
        for g in range(sh.gpus):
            util = np.clip(np.round(85 - self.gpu_shift + 10 * phase + rng.normal(0, 6, n)), 0, 100)
            util[ckpt] = np.round(rng.uniform(0, 5, int(ckpt.sum())))
            used = self.gpu_used[g] + np.cumsum(rng.random(n) < 0.001) * 2**21
            self.gpu_used[g] = used[-1]
            cols += [util, 100 * used / 8.5e10, used, np.clip(np.round(util * 0.6 + rng.normal(0, 3, n)), 0, 100),
                     np.round(250 + 100 * phase + rng.normal(0, 15, n), 3),
                     np.round(65 + 3 * phase + rng.normal(0, 0.5, n)),
                     np.where(rng.random(n) < 0.95, 1980.0, 1755.0)]
        workers = np.where(rng.random(n) < 0.98, 2.0 * sh.ranks, 2.0 * sh.ranks - 1)
        cols += [core.mean(axis=1) * 0.8, 3.2e10 + mem * 1e7, workers + sh.ranks, workers,
                 np.minimum(workers, np.round(workers * rng.random(n) + 0.5)), core.mean(axis=1) * 0.4]
        return ts, np.column_stack(cols)


def _loader_args(rank: int, dataset: str, pid: int) -> str:
    return json.dumps({"loader_id": 140_000_000 + rank * 16 + (dataset == "Val"), "dataset": dataset,
                       "batch_size": 256, "num_workers": 2, "pin_memory": True, "prefetch_factor": 2,
                       "persistent_workers": False, "drop_last": dataset != "Val", "timeout": 0,
                       "sampler": "DistributedSampler", "multiprocessing_context": "fork",
                       "worker_pids": [pid + 1, pid + 2]})


def rank_columns(shape: Shape, node_index: int, rank: int, end_us: int, slow_factor: float) -> dict[str, np.ndarray]:
    """One rank's events as columns (FrameworkWriter's): after 3 minutes of initialization, per hour a training
    epoch of ~`step_s` steps then a 60 s evaluation pass of ~0.4×`step_s` steps; 5 events per step, a
    `dataloader` event when each loop starts; 0.1 % of training steps 3× slower (waiting for data)."""
    rng = np.random.default_rng(1000 * shape.seed + 100 * node_index + rank)
    pid = 5000 + rank * 100
    step_us = shape.step_s * S * slow_factor
    train_n = max(1, int((3600 - 60) / (shape.step_s * slow_factor)))
    eval_n = max(1, int(60 / (0.4 * shape.step_s * slow_factor)))
    parts: list[dict[str, Any]] = []
    t = T0 + 180 * S + int(rng.integers(0, 20_000))
    counts = {r.TRAIN: 0, r.EVAL: 0}
    while t < end_us:
        for mode, n, scale in ((r.TRAIN, train_n, 1.0), (r.EVAL, eval_n, 0.4)):
            if t >= end_us:
                break
            dataset = "ImageNet" if mode == r.TRAIN else "Val"
            parts.append(_events("dataloader", "ImageFolder", r.GLOBAL, [None], [t], [t], pid,
                                 _loader_args(rank, dataset, pid)))
            dur = (step_us * scale * rng.lognormal(0, 0.04, n)).astype(np.int64)
            wait = (dur * 0.02).astype(np.int64)
            if mode == r.TRAIN:
                slow = rng.random(n) < 0.001
                dur[slow] *= 3
                wait[slow] = dur[slow] // 2
            starts = t + np.concatenate([[0], np.cumsum(dur[:-1] + 30)]).astype(np.int64)
            keep = starts < end_us
            starts, dur, wait = starts[keep], dur[keep], wait[keep]
            steps = np.arange(counts[mode], counts[mode] + len(starts))
            counts[mode] += len(starts)
            rest = dur - wait
            name = "train_step" if mode == r.TRAIN else "eval_step"
            parts.append(_events("step", name, mode, steps, starts, starts + dur, pid))
            parts.append(_events("data_wait", "next_batch", mode, steps, starts, starts + wait, pid))
            f0 = starts + wait + 50
            fwd = (rest * (0.33 if mode == r.TRAIN else 0.95)).astype(np.int64)
            parts.append(_events("forward", "ResNet", mode, steps, f0, f0 + fwd, pid))
            if mode == r.TRAIN:
                b0 = f0 + fwd + 30
                b1 = b0 + (rest * 0.55).astype(np.int64)
                parts.append(_events("backward", "backward", mode, steps, b0, b1, pid))
                o0 = b1 + 20
                parts.append(_events("optimizer", "AdamW", mode, steps, o0, o0 + (rest * 0.1).astype(np.int64), pid))
            t = int(starts[-1] + dur[-1] + 30) if len(starts) else end_us
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(cols["start_us"], kind="stable")
    return {k: v[order] for k, v in cols.items()}


def _events(kind: str, name: str, mode: str, steps: Any, starts: Any, ends: Any, pid: int,
            args: str = "") -> dict[str, np.ndarray]:
    n = len(starts)
    return {"pid": np.full(n, pid, np.int32), "kind": np.full(n, kind, object), "name": np.full(n, name, object),
            "mode": np.full(n, mode, object), "step": np.asarray(steps, object),
            "start_us": np.asarray(starts, np.int64), "end_us": np.asarray(ends, np.int64),
            "args": np.full(n, args, object)}


def _write_framework(loc: Any, node: str, rank: int, cols: dict[str, np.ndarray]) -> int:
    """Segments of 10 minutes of event starts, encoded and named exactly as FrameworkWriter.rotate() does."""
    from stallwatch.store import layout
    from stallwatch.store.chunk_writer import SEGMENT_US
    from stallwatch.store.framework_codec import encode

    start = cols["start_us"]
    bucket = (start - start[0]) // SEGMENT_US
    edges = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1], True])
    for a, b in zip(edges[:-1], edges[1:]):
        part = {k: v[a:b].tolist() for k, v in cols.items()}
        name = layout.chunk_name(layout.SEGMENT, int(start[a:b].min()), int(cols["end_us"][a:b].max()))
        loc.write_atomic(f"{layout.framework_dir(node, rank)}/{name}", encode(layout.SEGMENT, part))
    return len(start)


def _write_node(root: Path, shape: Shape, k: int) -> tuple[int, int]:
    """Node `k`'s snapshots, framework segments and node record; returns (events, steps). Nodes are independent
    (each seeded by its index), so any number of them can be written at once."""
    from stallwatch.store import layout
    from stallwatch.store.location import RunLocation

    loc = RunLocation(str(root))
    end_us = T0 + int(shape.hours * 3600 * S)
    keys = system_keys(shape)
    node = f"algo-{k + 1}"
    n = int(shape.hours * 3600 * 1000 // shape.interval_ms)
    events = steps = 0
    odd = shape.nodes > 1 and k == shape.nodes - 1
    signal = NodeSignal(shape, seed=shape.seed * 100 + k, gpu_shift=25.0 if odd else 0.0)
    w = _common.write_snapshots(loc, node, keys, signal, n, shape.interval_ms)
    ranks = []
    if shape.framework:
        for rank in range(shape.ranks):
            global_rank = k * shape.ranks + rank
            cols = rank_columns(shape, k, global_rank, end_us, 1.25 if odd else 1.0)
            events += _write_framework(loc, node, global_rank, cols)
            steps += int(np.count_nonzero(cols["kind"] == "step"))
            ranks.append({"rank": global_rank, "local_rank": rank, "world_size": shape.nodes * shape.ranks,
                          "pid": 5000 + global_rank * 100})
    record = {"node": node, "start_us": T0, "end_us": end_us + S, "command": ["python", "train.py"],
              "cwd": "/work", "status": "finished", "hostname": node, "cpu_cores_logical": shape.cores,
              "cpu_cores_physical": max(1, shape.cores // 2), "memory_total_bytes": 1100 * 10**9,
              "gpus": [{"index": g, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85 * 10**9}
                       for g in range(shape.gpus)],
              "gpu_driver": "550.54.15" if shape.gpus else None, "platform": "Linux", "python": "3.11",
              "sampler_pid": 4242, "job_pid": 4243, "ranks": ranks, "metrics": [key.column for key in keys],
              "sample_interval_ms": shape.interval_ms, "exit_code": 0, "samples_written": w.samples_written,
              "samples_dropped": w.samples_dropped, "ticks_missed": 0, "sampler_end_us": end_us}
    if not shape.gpus:
        record["gpu_absent_reason"] = "no NVIDIA driver"
    loc.write_atomic(layout.node_json(node), json.dumps(record, indent=2, sort_keys=True).encode())
    return events, steps


def generate(root: Path, shape: Shape = Shape(), jobs: int = 1) -> dict[str, Any]:
    """Write the run into `root` with the store's writers, `jobs` nodes at a time; returns a summary."""
    from concurrent.futures import ProcessPoolExecutor

    from stallwatch.store import layout
    from stallwatch.store.location import RunLocation

    t_start = time.perf_counter()
    loc = RunLocation(str(root))
    loc.write_atomic(layout.RUN_JSON, json.dumps({
        "format_version": 1, "run_id": root.name, "created_us": T0, "created_by_node": "algo-1",
        "command": ["torchrun", "--nnodes", str(shape.nodes), "--nproc-per-node", str(shape.ranks), "train.py"],
        "versions": {"python": "3.11"}, "config": {"sample_interval_ms": shape.interval_ms}}).encode())
    indices = range(shape.nodes)
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            counts = list(pool.map(_write_node, [root] * shape.nodes, [shape] * shape.nodes, indices))
    else:
        counts = [_write_node(root, shape, k) for k in indices]
    n = int(shape.hours * 3600 * 1000 // shape.interval_ms)
    return {"format": FORMAT, "shape": asdict(shape), "snapshots_per_node": n, "series": len(system_keys(shape)),
            "events": sum(e for e, _ in counts), "steps": sum(s for _, s in counts),
            "generate_s": round(time.perf_counter() - t_start, 1)}


def dataset(data: Path, shape: Shape = Shape(), jobs: int = 1) -> tuple[Path, dict[str, Any]]:
    """The run directory `data/run`, generated (`jobs` nodes at a time) unless a complete one of this format and
    shape is there."""
    run = data / "run"
    marker = data / "complete.json"
    if marker.exists():
        summary = json.loads(marker.read_text())
        if summary.get("format") == FORMAT and summary.get("shape") == asdict(shape):
            return run, summary
    if run.exists():
        shutil.rmtree(run)
    data.mkdir(parents=True, exist_ok=True)
    summary = generate(run, shape, jobs)
    summary["bytes"] = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
    marker.write_text(json.dumps(summary))
    return run, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--interval-ms", type=int, default=500)
    ap.add_argument("--cores", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--no-framework", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="nodes written at once (processes)")
    a = ap.parse_args()
    shape = Shape(a.nodes, a.hours, a.interval_ms, a.cores, a.gpus, a.ranks, framework=not a.no_framework)
    run, summary = dataset(a.data, shape, a.jobs)
    print(run)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
