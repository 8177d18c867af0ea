"""Small real runs for tests (launcher-shaped JSON, data by the real SystemWriter), with every value planted."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from stallwatch.records import MetricKey
from stallwatch.store import layout
from stallwatch.store.location import RunLocation
from stallwatch.store.system_writer import SystemWriter

T0 = 1_763_790_000_000_000  # 2025-11-22T05:40:00Z
S = 1_000_000

KEYS = [
    MetricKey("cpu", "cpu_util"), MetricKey("cpu", "cpu_iowait"),
    MetricKey("cpu0", "cpu_util"), MetricKey("cpu1", "cpu_util"),
    MetricKey("memory", "mem_util"), MetricKey("memory", "mem_used_bytes"),
    MetricKey("gpu0", "gpu_util"),
    MetricKey("proc", "cpu_util"), MetricKey("proc", "workers_alive"),
]


def planted_value(node_index: int, i: int, j: int) -> float:
    """Whole numbers (exact in float32); gpu0 is missing every fifth snapshot, so NaN handling shows."""
    if KEYS[j].device == "gpu0" and i % 5 == 4:
        return math.nan
    if KEYS[j].metric == "mem_used_bytes":
        return float(2**30 + 4096 * i + 128 * node_index)  # float32 steps are 128 B up here
    return float((i * 7 + j * 13 + node_index * 29) % 101)


@dataclass
class NodeData:
    name: str
    timestamps: list[int] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)  # (timestamp_us, node, device, metric, value), NaN left out


def run_record(run_id: str, node: str, start_us: int) -> dict:
    return {"format_version": 1, "run_id": run_id, "created_us": start_us, "created_by_node": node,
            "command": ["python", "train.py", "--epochs", "1"], "versions": {"python": "3.11.7"},
            "config": {"sample_interval_ms": 1000}}


def node_record(node: str, start_us: int, end_us: int | None, *, samples: int, cores: int = 2,
                finished: bool = True) -> dict:
    rec = {"node": node, "start_us": start_us, "end_us": end_us, "command": ["python", "train.py"],
           "cwd": "/work", "status": "finished" if finished else "running", "hostname": node,
           "cpu_cores_logical": cores, "cpu_cores_physical": 1, "memory_total_bytes": 8 * 2**30,
           "gpus": [], "gpu_driver": None, "gpu_absent_reason": "no NVIDIA driver", "platform": "Linux",
           "python": "3.11.7", "sampler_pid": 4242, "metrics": [k.column for k in KEYS],
           "sample_interval_ms": 1000}
    if finished:
        rec.update(exit_code=0, samples_written=samples, samples_dropped=0, ticks_missed=0, sampler_end_us=end_us)
    return rec


def write_node_json(location: RunLocation, record: dict) -> None:
    location.write_atomic(layout.node_json(record["node"]),
                          json.dumps(record, indent=2, sort_keys=True).encode())


def writer_for(sink, node: str, *, flush_s: float = 2, segment_s: float = 10) -> SystemWriter:
    return SystemWriter(sink, node, KEYS, interval_us=S, flush_interval_us=int(flush_s * S), max_bytes=1 << 30,
                        segment_us=int(segment_s * S))


def feed(writer: SystemWriter, data: NodeData, node_index: int, first: int, count: int,
         t0: int = T0) -> None:
    """Append snapshots `first`…`first+count-1`, one second apart, ticking like the sampler does."""
    for i in range(first, first + count):
        ts = t0 + i * S
        values = [planted_value(node_index, i, j) for j in range(len(KEYS))]
        writer.append(ts, values)
        writer.tick(ts)
        data.timestamps.append(ts)
        data.rows += [(ts, data.name, k.device, k.metric, v) for k, v in zip(KEYS, values) if not math.isnan(v)]


def make_run(root: Path, nodes: tuple[str, ...] = ("algo-1", "algo-2"), seconds: int = 30,
             t0: int = T0, offsets_s: tuple[int, ...] | None = None) -> dict[str, NodeData]:
    """A finished run: every node sampled `seconds` snapshots (node k starts offsets_s[k] seconds late)."""
    location = RunLocation(str(root))
    offsets_s = offsets_s or tuple(0 for _ in nodes)
    location.write_atomic(layout.RUN_JSON, json.dumps(run_record(root.name, nodes[0], t0)).encode())
    out = {}
    for k, (node, off) in enumerate(zip(nodes, offsets_s)):
        data = NodeData(node)
        start = t0 + off * S
        w = writer_for(location, node)
        feed(w, data, k, off, seconds, t0)
        w.close()
        end = data.timestamps[-1] + S // 2
        write_node_json(location, node_record(node, start, end, samples=seconds))
        out[node] = data
    return out


def all_rows(nodes: dict[str, NodeData]) -> list[tuple]:
    return sorted(r for d in nodes.values() for r in d.rows)
