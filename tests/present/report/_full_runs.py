"""Whole generated runs for the report's tests, written with the store's own writers (tests/present/
generated_run.py): system snapshots of healthy nodes (tests/analyze/rules/_gen.py) with a planted CPU
bottleneck, a training loop per rank with planted slow steps (_fw_gen.py), collectives when there are several
ranks, and a detailed-profiling window with CPU and GPU operators. Every planted value is named here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stallwatch.records import COLLECTIVE, TRAIN
from stallwatch.store import layout, profiles_codec
from stallwatch.store.location import RunLocation
from tests.analyze.rules._fw_gen import MS, FwGen, S
from tests.analyze.rules._gen import START_US, make_node, plant_cpu_bottleneck
from tests.present.generated_run import write_run

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"  # a node name can hold no '/', so the node carries this payload
SNAPSHOTS = 1200  # 10 minutes at 500 ms: past the system rules' default patience of 1000 snapshots
BOTTLENECK = (1000, 1200)  # snapshots of the first node where gpu0 is idle and cpu0 saturated (CPUBottleneck fires)
LOOP_START_US = START_US + 60 * S  # initialization: the first minute
STEPS = 1500  # per training pass (two passes, an evaluation pass between them)
SLOW_STEPS = {100 + 50 * i: 2 * S for i in range(12)}  # 12 outliers per rank > n_outliers 10: StepOutlier fires
# Operators of the detailed-profiling window: (name, device, calls, self µs, total µs)
OPERATORS = [("aten::convolution_backward", "cpu", 20, 40_000.0, 52_000.0),
             ("aten::addmm", "cpu", 40, 25_000.0, 30_000.0),
             ("aten::relu", "cpu", 40, 5_000.0, 5_000.0),
             ("aten::mm", "cpu", 10, 1_000.0, 1_000.0),
             ("volta_sgemm_128x64_nn", "cuda", 40, 90_000.0, 90_000.0),
             ("void at::native::elementwise_kernel", "cuda", 80, 10_000.0, 10_000.0)]


@dataclass(frozen=True)
class Planted:
    """What a generated run holds, for the assertions."""
    root: Path
    nodes: tuple[str, ...]
    gpus: int
    ranks: int
    framework: bool
    operators: bool


def full_run(root: Path, *, nodes: tuple[str, ...] = ("algo-1",), gpus: int = 2, cores: int = 4, ranks: int = 1,
             framework: bool = True, operators: bool = True, operator_name: str | None = None,
             command: list[str] | None = None) -> Planted:
    """A finished run of `nodes` (each `cores` cores, `gpus` GPUs: 0 is CPU-only) and `ranks` ranks per node."""
    frames = [make_node(node, SNAPSHOTS, cores, gpus, seed=k) for k, node in enumerate(nodes)]
    if gpus:
        plant_cpu_bottleneck(frames[0], *BOTTLENECK)
    fw = FwGen()
    if framework:
        for node in nodes:
            for rank in range(ranks):
                _rank_events(fw, node, rank, ranks)
    write_run(root, frames, fw.table() if framework else None)
    loc = RunLocation(str(root))
    if command is not None:
        record = json.loads(loc.read(layout.RUN_JSON))
        loc.write_atomic(layout.RUN_JSON, json.dumps({**record, "command": command}).encode())
    if framework and operators:
        _operator_window(loc, nodes[0], 0, gpus > 0, operator_name)
    return Planted(root, nodes, gpus, ranks, framework, framework and operators)


def _rank_events(fw: FwGen, node: str, rank: int, ranks: int) -> None:
    """Train 1500 steps of 100 ms (planted slow ones), evaluate 200 steps of 50 ms, train 1500 more; a
    data-loader iterator per rank; an all-reduce in every training step when there are several ranks."""
    fw.dataloader(node=node, rank=rank, at_us=LOOP_START_US - 10 * MS, num_workers=4)
    s1, e1 = fw.steps(node=node, rank=rank, n=STEPS, start_us=LOOP_START_US, slow=SLOW_STEPS, seed=rank)
    _, e2 = fw.steps(node=node, rank=rank, mode="EVAL", n=200, start_us=int(e1[-1]) + 5 * S, step_us=50 * MS,
                     seed=rank)
    s3, e3 = fw.steps(node=node, rank=rank, n=STEPS, first_step=STEPS, start_us=int(e2[-1]) + 5 * S, seed=rank)
    if ranks > 1:
        starts = np.concatenate([s1, s3])
        ends = np.concatenate([e1, e3])
        steps = np.arange(2 * STEPS)
        fw.events(node, rank, COLLECTIVE, "all_reduce", TRAIN, steps, ends - 8 * MS, ends - 2 * MS)
        assert (ends - 8 * MS > starts).all()


def _operator_window(loc: RunLocation, node: str, rank: int, gpu: bool, name: str | None) -> None:
    """One complete detailed-profiling window (operators.parquet, then window.json), as the job leaves it;
    `name` (if given) is the most expensive CPU operator."""
    rows = [{"operator": n, "device": d, "calls": c, "self_us": s, "total_us": t} for n, d, c, s, t in OPERATORS
            if gpu or d == "cpu"]
    if name is not None:
        rows.append({"operator": name, "device": "cpu", "calls": 7, "self_us": 80_000.0, "total_us": 80_000.0})
    start = LOOP_START_US + 5 * 101 * MS
    window = layout.window_name("detailed", start)
    d = layout.trace_window_dir(node, rank, window)
    loc.write_atomic(f"{d}/{layout.OPERATORS_PARQUET}", profiles_codec.encode_operators(rows))
    record = {"layer": "detailed", "start_us": start, "end_us": start + 101 * MS, "node": node, "rank": rank,
              "window": window, "files": [layout.OPERATORS_PARQUET], "summary_error": None, "first_step": 5,
              "last_step": 5, "range": "5:1", "mode": TRAIN, "profiler": "torch.profiler",
              "activities": ["cpu", "cuda"] if gpu else ["cpu"], "status": "complete"}
    loc.write_atomic(f"{d}/{layout.WINDOW_JSON}", json.dumps(record).encode())

