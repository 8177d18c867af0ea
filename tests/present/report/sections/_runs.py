"""Generated runs for the section tests, written with the store's own writers (SystemWriter, FrameworkWriter)
into real run directories, each with its planted patterns named; and their RunAnalysis, with the rules'
results evaluated on the run as `stallwatch rules` would (small patience and windows, so runs stay short)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.base import NodeFrame
from stallwatch.analyze.judge.feed import read_run
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.records import FrameworkEvent, MetricKey
from stallwatch.store import layout
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run
from stallwatch.store.run_files import jsonable as _plain
from stallwatch.store.system_writer import SystemWriter

from ....analyze.rules import _gen
from ....analyze.rules._fw_gen import MINUTE, T0, FwGen, S

HOUR = 3600 * S
INTERVAL_US = _gen.INTERVAL_US  # 500 ms
PATIENCE, WINDOW = 20, 100
# Rule parameters for short generated runs (the defaults skip 1000 snapshots and use windows of 500).
PARAMS: dict[str, dict[str, Any]] = {
    "CPUBottleneck": {"patience": PATIENCE}, "IOBottleneck": {"patience": PATIENCE},
    "LowGPUUtilization": {"patience": PATIENCE, "window": WINDOW},
    "BatchSize": {"patience": PATIENCE, "window": WINDOW},
    "GPUMemoryIncrease": {"patience": PATIENCE, "window": 50},
    "LoadBalancing": {"patience": PATIENCE},
    "StepOutlier": {"min_excess_pct": 1.0},  # 12 stalls of 0.3 s extra in a 150 s loop: 2.3 % of it
}


def write_run(root: Path, frames: list[NodeFrame], events: pa.Table | None = None, *,
              end_us: dict[str, int] | None = None) -> Path:
    """A finished run: each frame's snapshots as the sampler stores them, `events` (framework_schema rows) as
    the ranks' writers store them, run.json and one node record per frame (its `info` merged in)."""
    loc = RunLocation(str(root))
    loc.write_atomic(layout.RUN_JSON, json.dumps({
        "format_version": 1, "run_id": root.name, "created_us": int(frames[0].timestamps[0]),
        "created_by_node": frames[0].node, "command": ["python", "train.py"], "versions": {"python": "3.11"},
        "config": {"sample_interval_ms": INTERVAL_US // 1000}}).encode())
    for frame in frames:
        keys = [MetricKey.from_column(c) for c in frame.columns]
        w = SystemWriter(loc, frame.node, keys, interval_us=INTERVAL_US, flush_interval_us=HOUR, max_bytes=1 << 40,
                         segment_us=HOUR)
        values = np.column_stack([frame.columns[k.column] for k in keys]).astype(np.float64)
        for ts, row in zip(frame.timestamps.tolist(), values):
            w.append(ts, row)
        w.close()
        start = int(frame.timestamps[0])
        end = (end_us or {}).get(frame.node, int(frame.timestamps[-1]) + INTERVAL_US)
        record = {"cpu_cores_logical": 4, "gpus": [], **frame.info, "node": frame.node, "start_us": start,
                  "end_us": end, "status": "finished", "exit_code": 0, "sample_interval_ms": INTERVAL_US // 1000,
                  "metrics": [k.column for k in keys], "samples_written": len(frame)}
        loc.write_atomic(layout.node_json(frame.node), json.dumps(record).encode())
    if events is not None and events.num_rows:
        _write_events(loc, events)
    return root


def _write_events(loc: RunLocation, events: pa.Table) -> None:
    rows = events.to_pylist()
    writers: dict[tuple[str, int], FrameworkWriter] = {}
    for r in rows:
        key = (r["node"], r["rank"])
        if key not in writers:
            writers[key] = FrameworkWriter(loc, r["node"], r["rank"], flush_interval_us=HOUR, max_bytes=1 << 40,
                                           segment_us=HOUR)
        writers[key].append(FrameworkEvent(r["kind"], r["name"], r["start_us"], r["end_us"], r["mode"], r["step"],
                                           r["pid"], r["args"]))
    for w in writers.values():
        w.close()


def context(root: Path, params: dict[str, dict[str, Any]] | None = None) -> RunAnalysis:
    """The run's RunAnalysis with the rules evaluated on it (results as stored JSON would read back)."""
    run = open_run(str(root))
    results = evaluate(builtin_rules(), [read_run(run, builtin_rules())], PARAMS if params is None else params)
    return RunAnalysis(run, rule_results=as_stored(results))


def as_stored(results: list[RuleResult]) -> list[RuleResult]:
    """The results as a stored rules/<Name>.json reads back: through JSON and `RuleResult.from_json`."""
    return [RuleResult.from_json(json.loads(json.dumps(r.to_json(), default=_plain))) for r in results]


# --------------------------------------------------------------------------------------------------
# The generated runs (built once per test session: `built(name, tmp_path_factory)`)

N_SNAPSHOTS = 600  # 5 minutes at 500 ms
N_STEPS = 1500  # TRAIN steps per rank, about 0.1 s each
SLOW_STEPS = tuple(range(100, 1300, 100))  # 12 > n_outliers (10)
SLOW_US = 400_000  # the planted slow steps last 0.4 s (normal: 0.1 s) ...
SLOW_WAIT_US = 300_000  # ... 0.3 s of which waiting for data
STARVED_WAIT_US = 30_000  # algo-2's rank 1 waits 30 % of each step for its batch (the loader is a bottleneck)
CPU_BOTTLENECK = (100, 400)  # algo-2: gpu0 at 5 % while core 0 is at 95 %
IO_BOTTLENECK = (450, 480)  # algo-1: gpu0 at 5 % while core 1 waits on I/O 60 %
IDLE_GPU = (200, 600)  # algo-1: gpu1 at 30 % (underutilized, and unlike gpu0)
MEMORY_STEP = (350, 12.0)  # algo-2: gpu1's memory rises by 12 points at snapshot 350
LOOP_START_US = T0 + 55 * S  # 55 s of initialization, then steps on algo-2 (inside the CPU bottleneck)


def gpu_run(root: Path) -> Path:
    """Two GPU nodes with every pattern above planted; framework events on algo-2, ranks 0 and 1: TRAIN steps
    (rank 0 with the planted slow steps, rank 1 starved: it waits STARVED_WAIT_US for each batch), a few EVAL
    steps, one data loader each with num_workers=1 and no pinned memory on 4 cores."""
    a = _gen.make_node("algo-1", N_SNAPSHOTS, cores=4, gpus=2, seed=1, start_us=T0)
    b = _gen.make_node("algo-2", N_SNAPSHOTS, cores=4, gpus=2, seed=2, start_us=T0)
    _gen.plant_gpu_util(a, 1, *IDLE_GPU, 30.0)
    _gen.plant_io_bottleneck(a, *IO_BOTTLENECK, gpu=0, core=1)
    _gen.plant_cpu_bottleneck(b, *CPU_BOTTLENECK, gpu=0, core=0)
    _gen.plant_memory_step(b, 1, MEMORY_STEP[0], MEMORY_STEP[1])
    gen = FwGen()
    for rank in (0, 1):
        gen.dataloader(node="algo-2", rank=rank, at_us=LOOP_START_US - S, num_workers=1, pin_memory=False)
        slow = {n: SLOW_US for n in SLOW_STEPS} if rank == 0 else None
        waits = np.full(N_STEPS, 5_000 if rank == 0 else STARVED_WAIT_US, np.int64)
        if rank == 0:
            waits[list(SLOW_STEPS)] = SLOW_WAIT_US
        _, ends = gen.steps(node="algo-2", rank=rank, n=N_STEPS, start_us=LOOP_START_US, slow=slow, data_wait_us=waits,
                            seed=rank)
        gen.steps(node="algo-2", rank=rank, mode="EVAL", n=20, start_us=int(ends[-1]) + S, step_us=50_000, seed=9)
    return write_run(root, [a, b], gen.table())


def cpu_only_run(root: Path) -> Path:
    """One CPU-only node, no framework data."""
    return write_run(root, [_gen.make_node("cpu-box", 300, cores=4, gpus=0, seed=3, start_us=T0)])


INIT_MINUTES = 25  # the first step starts 25 minutes after the job (MaxInitializationTime's threshold: 20)


def slow_start_run(root: Path) -> Path:
    """One CPU-only node whose first step starts 25 minutes in, then 2 minutes of steps (initialization took
    longer than the training loop)."""
    first = T0 + INIT_MINUTES * MINUTE
    gen = FwGen()
    gen.dataloader(node="slow", at_us=first - S, num_workers=4, pin_memory=False)
    _, ends = gen.steps(node="slow", n=1200, start_us=first)
    frame = _gen.make_node("slow", 200, cores=4, gpus=0, seed=4, start_us=T0)
    return write_run(root, [frame], gen.table(), end_us={"slow": int(ends[-1]) + 5 * S})


BUILDERS = {"gpu": gpu_run, "cpu_only": cpu_only_run, "slow_start": slow_start_run}
_BUILT: dict[str, RunAnalysis] = {}


def built(name: str, tmp_path_factory: Any) -> RunAnalysis:
    """The named run's context, generated once per test session."""
    if name not in _BUILT:
        root = BUILDERS[name](tmp_path_factory.mktemp("report-sections") / name)
        _BUILT[name] = context(root)
    return _BUILT[name]


# --------------------------------------------------------------------------------------------------
# Reading the blocks back


def blocks_of(sections: list[Any], kind: type) -> list[Any]:
    return [b for s in sections for b in s.blocks if isinstance(b, kind)]


def table(sections: list[Any], caption_start: str) -> Any:
    """The one table whose caption starts with `caption_start`."""
    from stallwatch.present.report.model import Table

    found = [t for t in blocks_of(sections, Table) if t.caption.startswith(caption_start)]
    assert len(found) == 1, [t.caption for t in blocks_of(sections, Table)]
    return found[0]


def rows_by(t: Any, *keys: str) -> dict[tuple, dict[str, Any]]:
    """A table's rows as dicts keyed by the values of the `keys` columns."""
    out = {}
    for r in t.rows:
        d = dict(zip(t.columns, r))
        out[tuple(d[k] for k in keys)] = d
    return out


@dataclass
class Drawn:
    """One set of columns a chart spec draws as one glyph (the test's view of a spec's data)."""
    data: dict[str, Any]


def _drawn(spec: Any) -> list[tuple[str, Drawn]]:
    """(glyph, columns) of everything a chart spec draws, grids included."""
    from stallwatch.present import charts

    if isinstance(spec, charts.GridSpec):
        return [d for c in spec.children for d in _drawn(c)]
    if isinstance(spec, charts.HistogramSpec):
        return ([("Quad", Drawn({"left": s.left, "right": s.right, "top": s.top, "series": [s.name] * len(s.left)}))
                 for s in spec.series] +
                [("Scatter", Drawn({"x": list(m.x), "name": list(m.text), "series": [m.name] * len(m.x)}))
                 for m in spec.markers])
    if isinstance(spec, charts.BoxSpec):
        return [("VBar", Drawn({"label": list(spec.categories), **{k: list(getattr(spec, k)) for k in
                                ("lower", "p25", "p50", "p75", "upper", "p95", "max")}}))]
    if isinstance(spec, charts.BarsSpec):
        return ([("VBar", Drawn({"x": list(spec.categories), "top": list(s.values), **spec.tips})) for s in spec.series]
                + [("Scatter", Drawn({"x": list(spec.categories), "y": list(s.values)})) for s in spec.points])
    if isinstance(spec, charts.PieSpec):
        return [("Wedge", Drawn({"label": [s.label], "value": [s.value]})) for s in spec.slices]
    if isinstance(spec, charts.TimeSpec):
        return [("Line", Drawn({"x": line.x, "y": line.y, "name": line.name})) for p in spec.panels for line in p.lines]
    if isinstance(spec, charts.HeatmapSpec):
        return [("Image", Drawn({"image": [spec.values]}))]
    raise TypeError(f"not a chart spec: {type(spec).__name__}")


def sources(model: Any) -> list[Any]:
    """Every set of columns a chart spec draws."""
    return [d for _, d in _drawn(model)]


def glyph_sources(model: Any, glyph: str) -> list[Any]:
    """The columns a chart spec draws as `glyph` ("Quad", "VBar", "Scatter", "Wedge", "Line")."""
    return [d for g, d in _drawn(model) if g == glyph]
