"""Generated runs for the report's and the notebook's tests: NodeFrames (tests/analyze/rules/_gen.py) and framework
events (_fw_gen.py) written into a real run directory with the store's own writers, GPUs included."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from stallwatch.analyze.rules.base import NodeFrame
from stallwatch.records import FrameworkEvent, MetricKey
from stallwatch.store import layout
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation
from stallwatch.store.system_writer import SystemWriter
from tests.analyze.rules._fw_gen import FwGen
from tests.analyze.rules._gen import INTERVAL_US, START_US, make_node

S = 1_000_000


def node_record(frame: NodeFrame, *, interval_us: int, end_us: int, **extra: Any) -> dict[str, Any]:
    """nodes/<node>.json as the sampler writes it at the end of a finished job."""
    gpus = frame.info.get("gpus") or []
    rec = {"node": frame.node, "hostname": frame.node, "start_us": int(frame.timestamps[0]), "end_us": end_us,
           "command": ["python", "train.py"], "cwd": "/work", "status": "finished", "exit_code": 0,
           "cpu_cores_logical": frame.info.get("cpu_cores_logical", 4), "cpu_cores_physical": 2,
           "memory_total_bytes": 64 * 2**30, "gpus": gpus, "gpu_driver": "550.54.15" if gpus else None,
           "platform": "Linux", "python": "3.11.7", "sampler_pid": 4242, "job_pid": 4243,
           "metrics": list(frame.columns), "sample_interval_ms": interval_us // 1000,
           "samples_written": len(frame), "samples_dropped": 0, "ticks_missed": 0, "sampler_end_us": end_us}
    if not gpus:
        rec["gpu_absent_reason"] = "no NVIDIA driver"
    rec.update(extra)
    return rec


def write_run(root: Path, frames: list[NodeFrame], events: pa.Table | None = None, *,
              interval_us: int = INTERVAL_US, records: dict[str, dict[str, Any]] | None = None) -> Path:
    """Write the frames (system snapshots) and events (framework, `framework_schema()`) as a finished run."""
    loc = RunLocation(str(root))
    t0 = min(int(f.timestamps[0]) for f in frames)
    loc.write_atomic(layout.RUN_JSON, json.dumps({
        "format_version": 1, "run_id": root.name, "created_us": t0, "created_by_node": frames[0].node,
        "command": ["python", "train.py"], "versions": {"python": "3.11.7"},
        "config": {"sample_interval_ms": interval_us // 1000}}).encode())
    for frame in frames:
        keys = [MetricKey.from_column(c) for c in frame.columns]
        w = SystemWriter(loc, frame.node, keys, interval_us=interval_us, flush_interval_us=600 * S, max_bytes=1 << 40)
        matrix = np.column_stack([frame.columns[k.column] for k in keys]).astype(np.float64)
        for ts, row in zip(frame.timestamps.tolist(), matrix):
            w.append(ts, row)
            w.tick(ts)
        w.close()
        end = int(frame.timestamps[-1]) + interval_us
        rec = node_record(frame, interval_us=interval_us, end_us=end)
        rec.update((records or {}).get(frame.node, {}))
        loc.write_atomic(layout.node_json(frame.node), json.dumps(rec, indent=2, sort_keys=True).encode())
    if events is not None and events.num_rows:
        writers: dict[tuple[str, int], FrameworkWriter] = {}
        for e in events.to_pylist():
            key = (e["node"], e["rank"])
            if key not in writers:
                writers[key] = FrameworkWriter(loc, e["node"], e["rank"], flush_interval_us=600 * S, max_bytes=1 << 40)
            step = e["step"]
            writers[key].append(FrameworkEvent(e["kind"], e["name"], e["start_us"], e["end_us"], e["mode"],
                                               None if step is None or (isinstance(step, float) and math.isnan(step))
                                               else int(step), e["pid"], e["args"] or ""))
        for w in writers.values():
            w.close()
    return root


def training_run(root: Path, *, nodes: tuple[str, ...] = ("algo-1",), gpus: int = 2, cores: int = 4,
                 n: int = 1200, ranks: int = 1, slow: dict[int, int] | None = None,
                 with_framework: bool = True, frames: list[NodeFrame] | None = None) -> Path:
    """A finished run: `n` snapshots at 500 ms per node (healthy, from `make_node`), and per rank a training
    loop of 100 ms steps from 60 s in, an evaluation pass in the middle, then more training."""
    frames = frames or [make_node(node, n, cores, gpus, seed=k) for k, node in enumerate(nodes)]
    events = None
    if with_framework:
        fw = FwGen()
        for frame in frames:
            for rank in range(ranks):
                t = START_US + 60 * S
                first = {k: v for k, v in (slow or {}).items() if k < 1500}
                later = {k: v for k, v in (slow or {}).items() if k >= 1500}
                s, e = fw.steps(node=frame.node, rank=rank, n=1500, start_us=t, slow=first, seed=rank)
                s, e = fw.steps(node=frame.node, rank=rank, mode="EVAL", n=200, start_us=int(e[-1]) + 5 * S,
                                step_us=50_000, seed=rank)
                fw.steps(node=frame.node, rank=rank, n=1500, first_step=1500, start_us=int(e[-1]) + 5 * S, slow=later,
                         seed=rank)
        events = fw.table()
    return write_run(root, frames, events)
