"""Each step's memory as recorded in its args (`rss_kb`, `cuda_alloc_kb`, `cuda_reserved_kb`, `cuda_peak_kb`;
docs/format.md), decoded into columns once per table, and the robust slope MemoryGrowth and the report use. Runs
recorded before memory was measured read as -1 (no reading)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.records import STEP

if TYPE_CHECKING:
    from stallwatch.analyze.framework_frame import FrameworkColumns

RSS, CUDA_ALLOC, CUDA_RESERVED, CUDA_PEAK = "rss_kb", "cuda_alloc_kb", "cuda_reserved_kb", "cuda_peak_kb"
FIELDS = (RSS, CUDA_ALLOC, CUDA_RESERVED, CUDA_PEAK)
LABELS = {RSS: "host memory (RSS)", CUDA_ALLOC: "GPU memory allocated", CUDA_RESERVED: "GPU memory reserved",
          CUDA_PEAK: "GPU memory peak"}
_CACHE = "_memory_kb"
MAX_PAIRS_POINTS = 400  # Theil–Sen over at most this many points (pairs grow with the square)


def _pattern(name: str) -> str:
    return rf'"{name}":\s*(?P<v>\d{{1,15}})\D'  # at most 15 digits: a run directory is untrusted


def memory_columns(cols: FrameworkColumns, fields: tuple[str, ...] = FIELDS) -> dict[str, np.ndarray]:
    """Per row of a FrameworkColumns, each memory field of `fields` in KiB (-1 where the row is not a step or its
    args do not say); each decoded once per table and shared by the rules that ask."""
    cached: dict[str, np.ndarray] = cols.__dict__.setdefault(_CACHE, {})
    missing = [name for name in fields if name not in cached]
    if missing:
        rows = np.flatnonzero(cols.kind_is(STEP))
        args = cols.table["args"].take(pa.array(rows)) if rows.size and "args" in cols.table.column_names else None
        if args is not None and not pc.any(pc.match_substring(args, "_kb")).as_py():
            args = None  # a run recorded before memory was measured
        for name in missing:
            out = cached[name] = np.full(cols.n, -1, np.int64)
            if args is not None:
                found = pc.struct_field(pc.extract_regex(args, _pattern(name)), [0])
                out[rows] = pc.fill_null(pc.cast(found, pa.int64()), -1).to_numpy(zero_copy_only=False)
    return {name: cached[name] for name in fields}


def theil_sen(x: np.ndarray, y: np.ndarray, segments: np.ndarray | None = None) -> float:
    """The median of the slopes between every pair of points (Theil–Sen): one outlier in three moves it not at
    all, unlike a least-squares fit or a max − min. Points beyond MAX_PAIRS_POINTS are thinned evenly. With
    `segments` (a label per point), only pairs within one segment count: a one-time step between two segments
    (the buffers a profiler capture leaves allocated) is no slope."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    seg = np.zeros(x.size, np.int64) if segments is None else np.asarray(segments, np.int64)
    if x.size > MAX_PAIRS_POINTS:
        keep = np.linspace(0, x.size - 1, MAX_PAIRS_POINTS).round().astype(np.int64)
        x, y, seg = x[keep], y[keep], seg[keep]
    i, j = np.triu_indices(x.size, 1)
    dx = x[j] - x[i]
    ok = (dx != 0) & (seg[i] == seg[j])
    if not ok.any():
        return 0.0
    return float(np.median((y[j] - y[i])[ok] / dx[ok]))


MAX_POINTS = 1000  # a rank's timeline is at most this many points (medians of equal step ranges)


@dataclass(frozen=True)
class MemorySeries:
    """One rank's memory (`metric`, MB) against its step numbers, for the report's timeline."""

    node: str
    rank: int
    metric: str
    steps: np.ndarray
    mb: np.ndarray


def memory_timeline(table: pa.Table, max_points: int = MAX_POINTS) -> list[MemorySeries]:
    """Per rank and memory field, the memory each training step recorded (GLOBAL steps where a rank has no TRAIN
    steps), thinned to at most `max_points` medians of equal step ranges. `table`: step events with `args`."""
    from stallwatch.analyze.framework_frame import FrameworkColumns
    from stallwatch.records import GLOBAL, TRAIN

    if table.num_rows == 0:
        return []
    cols = FrameworkColumns(table)
    mem = memory_columns(cols)
    steps = cols.kind_is(STEP) & (cols.step >= 0)
    out = []
    groups = {key: rows for key, rows in cols.groups(steps & cols.mode_is((TRAIN, GLOBAL)))}
    for (node, rank, mode), rows in sorted(groups.items()):
        if mode == GLOBAL and (node, rank, TRAIN) in groups:
            continue
        for metric in FIELDS:
            values = mem[metric][rows]
            ok = values >= 0
            if not ok.any():
                continue
            x, y = cols.step[rows][ok], values[ok] / 1024.0
            order = np.argsort(x, kind="stable")
            x, y = x[order], y[order]
            if x.size > max_points:  # x is sorted: each bin is a slice
                edges = np.linspace(int(x[0]), int(x[-1]) + 1, max_points + 1)
                cuts = np.unique(np.searchsorted(x, edges))
                pieces = [(lo, hi) for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist()) if hi > lo]
                x = np.array([np.median(x[lo:hi]) for lo, hi in pieces])
                y = np.array([np.median(y[lo:hi]) for lo, hi in pieces])
            out.append(MemorySeries(node, rank, metric, x.astype(np.float64), np.round(y, 3)))
    return out
