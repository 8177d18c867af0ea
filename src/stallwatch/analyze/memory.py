"""Each step's memory as recorded in its args (`rss_kb`, `cuda_alloc_kb`, `cuda_reserved_kb`, `cuda_peak_kb`;
docs/format.md), decoded into columns once per table, and the robust slope MemoryGrowth and the report use. Runs
recorded before memory was measured read as -1 (no reading)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.records import STEP

if TYPE_CHECKING:
    from stallwatch.analyze.rules.steps import FrameworkColumns

RSS, CUDA_ALLOC, CUDA_RESERVED, CUDA_PEAK = "rss_kb", "cuda_alloc_kb", "cuda_reserved_kb", "cuda_peak_kb"
FIELDS = (RSS, CUDA_ALLOC, CUDA_RESERVED, CUDA_PEAK)
LABELS = {RSS: "host memory (RSS)", CUDA_ALLOC: "GPU memory allocated", CUDA_RESERVED: "GPU memory reserved",
          CUDA_PEAK: "GPU memory peak"}
_CACHE = "_memory_kb"
MAX_PAIRS_POINTS = 400  # Theil–Sen over at most this many points (pairs grow with the square)


def _pattern(name: str) -> str:
    return rf'"{name}":\s*(?P<v>\d{{1,15}})\D'  # at most 15 digits: a run directory is untrusted


def memory_columns(cols: FrameworkColumns) -> dict[str, np.ndarray]:
    """Per row of a FrameworkColumns, each memory field of the step in KiB (-1 where the row is not a step or its
    args do not say); decoded once per table and shared by the rules that ask."""
    cached = cols.__dict__.get(_CACHE)
    if cached is not None:
        return cached
    out = {name: np.full(cols.n, -1, np.int64) for name in FIELDS}
    rows = np.flatnonzero(cols.kind_is(STEP))
    if rows.size and "args" in cols.table.column_names:
        args = cols.table["args"].take(pa.array(rows))
        has_kb = pc.match_substring(args, "_kb")
        if pc.any(has_kb).as_py():
            for name in FIELDS:
                found = pc.struct_field(pc.extract_regex(args, _pattern(name)), [0])
                out[name][rows] = pc.fill_null(pc.cast(found, pa.int64()), -1).to_numpy(zero_copy_only=False)
    cols.__dict__[_CACHE] = out
    return out


def theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    """The median of the slopes between every pair of points (Theil–Sen): one outlier in three moves it not at
    all, unlike a least-squares fit or a max − min. Points beyond MAX_PAIRS_POINTS are thinned evenly."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.size > MAX_PAIRS_POINTS:
        keep = np.linspace(0, x.size - 1, MAX_PAIRS_POINTS).round().astype(np.int64)
        x, y = x[keep], y[keep]
    i, j = np.triu_indices(x.size, 1)
    dx = x[j] - x[i]
    ok = dx != 0
    if not ok.any():
        return 0.0
    return float(np.median((y[j] - y[i])[ok] / dx[ok]))
