"""One node's job memory against time, per rank — the host RSS and the CUDA allocator's figures each step
recorded (`analyze/memory.py`) — for the dashboard's memory chart, drawn on the same time axis as the node's
system charts. Every series is on one grid of at most `points` time buckets (each bucket the highest reading in
it, a leak's peaks stay visible; a bucket without a step carries the rank's previous reading)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.memory import FIELDS, memory_columns
from stallwatch.records import STEP

POINTS = 400


@dataclass(frozen=True)
class RankMemory:
    rank: int
    field: str  # rss_kb, cuda_alloc_kb, cuda_reserved_kb, cuda_peak_kb
    mb: list[float | None]  # MiB per bucket of the window's grid; None before the rank's first reading or after its last


@dataclass(frozen=True)
class MemoryWindow:
    ts: list[int] = field(default_factory=list)  # each bucket's middle, µs
    series: list[RankMemory] = field(default_factory=list)


def memory_window(table: pa.Table, points: int = POINTS) -> MemoryWindow:
    """`table`: one node's step events with `args`, of the time range asked."""
    if table.num_rows == 0:
        return MemoryWindow()
    cols = FrameworkColumns(table)
    mem = memory_columns(cols)
    steps = cols.kind_is(STEP)
    read = {name: steps & (mem[name] >= 0) for name in FIELDS}
    anything = np.logical_or.reduce(list(read.values()))
    if not anything.any():
        return MemoryWindow()
    t_all = cols.end[anything]
    lo, hi = int(t_all.min()), int(t_all.max()) + 1
    per_rank = max(int((anything & (cols.rank == r)).sum()) for r in np.unique(cols.rank[anything]))
    n = max(1, min(points, per_rank))
    width = max(1, -(-(hi - lo) // n))
    out = []
    for rank in sorted({int(r) for r in cols.rank[anything]}):
        for name in FIELDS:
            rows = np.flatnonzero(read[name] & (cols.rank == rank))
            if not rows.size:
                continue
            bucket = (cols.end[rows] - lo) // width
            values = np.full(n, -np.inf)
            np.maximum.at(values, np.minimum(bucket, n - 1), mem[name][rows] / 1024.0)
            have = np.isfinite(values)
            first, last = int(np.argmax(have)), n - 1 - int(np.argmax(have[::-1]))
            idx = np.maximum.accumulate(np.where(have, np.arange(n), 0))  # the last bucket with a reading
            filled = values[idx]
            mb: list[float | None] = [round(float(v), 1) if first <= i <= last else None for i, v in enumerate(filled)]
            out.append(RankMemory(rank, name, mb))
    return MemoryWindow([lo + i * width + width // 2 for i in range(n)], out)
