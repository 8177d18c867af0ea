"""Many nodes writing one run at once: N processes, each a machine with the same host name, claim a node name in
one run (the launcher's own claim: atomic, next free name when taken), write H hours of system snapshots at the
sampling interval and its ranks' framework events through the real writers (simulated time, as fast as they
go), then the run is read back and checked complete: every node named once, every snapshot and event there.

Run: python benchmarks/many_writers.py [--nodes 16] [--hours 24] [--interval-ms 500] [--ranks 1]
                                       [--steps-per-s 1] [--out DIR_OR_S3_URI]
Prints a table: writers, time to write, time to read back, snapshots and events expected and found, size.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

T0 = 1_763_790_000_000_000  # 2025-11-22T05:40:00Z
S = 1_000_000
HOSTNAME = "vm"  # every simulated machine has the same host name: the claims must tell them apart


@dataclass(frozen=True)
class Shape:
    nodes: int = 16
    hours: float = 24.0
    interval_ms: int = 500
    ranks: int = 1
    steps_per_s: float = 1.0
    cores: int = 16
    gpus: int = 8

    @property
    def snapshots(self) -> int:
        return int(self.hours * 3600 * 1000 / self.interval_ms)

    @property
    def steps(self) -> int:
        return int(self.hours * 3600 * self.steps_per_s)

    @property
    def events_per_rank(self) -> int:
        return self.steps * 4  # a step, its data wait, forward and backward


def write_node(uri: str, shape: Shape, seed: int) -> str:
    """One simulated machine: claims its name, writes its data, its finished record; returns its name."""
    from stallwatch.collect.launcher import claim_node
    from stallwatch.collect.node_name import default_node_name
    from stallwatch.records import FrameworkEvent
    from stallwatch.store import layout
    from stallwatch.store.framework_writer import FrameworkWriter
    from stallwatch.store.location import RunLocation
    from stallwatch.store.system_writer import SystemWriter

    location = RunLocation(uri)
    name = default_node_name([], {}, hostname=HOSTNAME)
    record = {"start_us": T0, "end_us": None, "status": "running", "cpu_cores_logical": shape.cores,
              "gpus": [{"index": i} for i in range(shape.gpus)], "sample_interval_ms": shape.interval_ms}
    node = claim_node(location, name, record, explicit=False)
    keys = _common.system_keys(shape.cores, shape.gpus)
    interval = shape.interval_ms * 1000
    system = SystemWriter(location, node, keys, interval_us=interval, flush_interval_us=5 * S, max_bytes=1 << 40)
    rng = np.random.default_rng(seed)
    values = rng.uniform(0, 100, (1024, len(keys)))
    for i in range(shape.snapshots):
        ts = T0 + i * interval
        system.append(ts, values[i % 1024])
        system.tick(ts)
    system.close()
    step_us = int(S / shape.steps_per_s)
    for rank in range(shape.ranks):
        fw = FrameworkWriter(location, node, rank, flush_interval_us=5 * S, max_bytes=1 << 40)
        for n in range(shape.steps):
            a = T0 + n * step_us
            fw.append(FrameworkEvent("step", "train_step", a, a + step_us - 10, "TRAIN", n, 100 + rank))
            fw.append(FrameworkEvent("data_wait", "next_batch", a, a + step_us // 10, "TRAIN", n, 100 + rank))
            fw.append(FrameworkEvent("forward", "Net", a + step_us // 10, a + step_us // 2, "TRAIN", n, 100 + rank))
            fw.append(FrameworkEvent("backward", "backward", a + step_us // 2, a + step_us - 20, "TRAIN", n, 100 + rank))
            fw.tick(a + step_us)
        fw.close()
    end = T0 + shape.snapshots * interval
    location.write_atomic(layout.node_json(node), _json({**record, "node": node, "end_us": end, "status": "finished",
                                                         "exit_code": 0, "samples_written": shape.snapshots}))
    return node


def _json(record: dict) -> bytes:
    import json

    return json.dumps(record, indent=2).encode()


def _one(args: tuple[str, Shape, int]) -> str:
    return write_node(*args)


def write_run(uri: str, shape: Shape) -> list[str]:
    """All nodes at once, one process each (spawned: nothing shared but the run)."""
    with mp.get_context("spawn").Pool(shape.nodes) as pool:
        return pool.map(_one, [(uri, shape, k) for k in range(shape.nodes)])


@dataclass(frozen=True)
class Check:
    nodes: list[str]
    snapshots: dict[str, int]
    events: dict[str, int]  # "node/rank" -> events


def read_back(uri: str) -> Check:
    """What the run holds, counted from the files' footers and the framework events' kinds column."""
    import pyarrow.compute as pc

    from stallwatch.store.reader import open_run

    run = open_run(uri)
    overview = run.system_overview()
    events = run.framework(fields=("kind",))
    keys = pc.binary_join_element_wise(events["node"].cast("string"), events["rank"].cast("string"), "/")
    counts = pc.value_counts(keys).to_pylist()
    return Check(run.nodes, {n: o.snapshots for n, o in overview.items()},
                 {c["values"]: c["counts"] for c in counts})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--interval-ms", type=int, default=500)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--steps-per-s", type=float, default=1.0)
    parser.add_argument("--out", help="the run's location (default: a temporary directory, removed after)")
    args = parser.parse_args()
    shape = Shape(args.nodes, args.hours, args.interval_ms, args.ranks, args.steps_per_s)
    tmp = None if args.out else tempfile.mkdtemp(prefix="many-writers-")
    uri = args.out or f"{tmp}/run"
    try:
        t = time.perf_counter()
        names = write_run(uri, shape)
        wrote = time.perf_counter() - t
        t = time.perf_counter()
        check = read_back(uri)
        read = time.perf_counter() - t
        size = sum(p.stat().st_size for p in Path(uri).rglob("*") if p.is_file()) if tmp else 0
        complete = (sorted(names) == sorted(check.nodes) and len(set(names)) == shape.nodes
                    and all(check.snapshots.get(n) == shape.snapshots for n in names)
                    and all(check.events.get(f"{n}/{r}") == shape.events_per_rank for n in names
                            for r in range(shape.ranks)))
        print("| writers | hours | snapshots/node | events/rank | write s | read back s | size MB | complete |")
        print("|---:|---:|---:|---:|---:|---:|---:|---|")
        print(f"| {shape.nodes} | {shape.hours:g} | {shape.snapshots:,} | {shape.events_per_rank:,} | {wrote:.1f} | "
              f"{read:.1f} | {size / 1e6:.1f} | {'yes' if complete else 'NO'} |")
        if not complete:
            missing = {n: (check.snapshots.get(n), [check.events.get(f'{n}/{r}') for r in range(shape.ranks)])
                       for n in names}
            print("found:", missing)
            sys.exit(1)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
