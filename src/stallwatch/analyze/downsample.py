"""Peak-keeping downsampling of time series for charts: equal-width time buckets, each keeping its minimum and
maximum (in time order), so a one-sample spike or dip survives a 1000× reduction where naive decimation drops it.
Pure numpy, vectorised over buckets; timestamps are int64 µs."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Buckets(NamedTuple):
    """Per-bucket statistics of a snapshots × series matrix on a regular time grid: `start[i]` is bucket i's
    first µs, every bucket `width` µs wide; min/max/mean are float32 buckets × series (NaN where a bucket has no
    value)."""
    start: np.ndarray
    min: np.ndarray
    max: np.ndarray
    mean: np.ndarray
    width: int


def _sorted(ts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ts = np.asarray(ts, dtype=np.int64)
    if len(ts) > 1 and np.any(ts[1:] < ts[:-1]):
        order = np.argsort(ts, kind="stable")
        return ts[order], values[order]
    return ts, values


def _grid(ts: np.ndarray, buckets: int) -> tuple[int, int, np.ndarray]:
    """(t0, width, starts): equal-width buckets over [ts[0], ts[-1]] and each non-empty bucket's first index."""
    t0, span = int(ts[0]), int(ts[-1]) - int(ts[0]) + 1
    width = max(1, -(-span // buckets))  # ceil: `buckets` buckets cover the whole span
    ids = (ts - t0) // width
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return t0, width, starts


def minmax(ts: np.ndarray, values: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """At most 2×`buckets` points of (ts, values): per equal-width time bucket its first minimum and first
    maximum, in time order (one point when they coincide). NaNs are skipped; a bucket with only NaNs keeps one
    NaN point so a line breaks at the gap. Input already within 2×`buckets` points is returned as is."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    values = np.asarray(values)
    if values.ndim != 1 or len(values) != len(ts):
        raise ValueError(f"values must be 1-D and as long as ts ({len(ts)}), got shape {values.shape}")
    ts, values = _sorted(ts, values)
    n = len(ts)
    if n <= 2 * buckets:
        return ts, values
    _, _, starts = _grid(ts, buckets)
    counts = np.diff(np.r_[starts, n])
    bucket_of = np.repeat(np.arange(len(starts)), counts)
    keep = [starts[np.isnan(np.fmax.reduceat(values, starts))]]  # all-NaN buckets: one NaN point each
    for reduce in (np.fmin, np.fmax):
        extreme = reduce.reduceat(values, starts)
        hits = np.flatnonzero(values == np.repeat(extreme, counts))  # NaN never equals: skipped
        first = np.r_[True, bucket_of[hits[1:]] != bucket_of[hits[:-1]]]
        keep.append(hits[first])
    idx = np.unique(np.concatenate(keep))
    return ts[idx], values[idx]


def minmax_matrix(ts: np.ndarray, matrix: np.ndarray, buckets: int) -> Buckets:
    """Per-bucket start, min, max and mean of every column of a snapshots × series `matrix`, on a regular grid
    of at most `buckets` equal-width buckets (never narrower than the median sampling interval, so sparse data
    does not come out striped). Empty buckets are NaN; NaNs in the data are skipped."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    matrix = np.asarray(matrix)
    if matrix.ndim != 2 or matrix.shape[0] != len(ts):
        raise ValueError(f"matrix must be snapshots × series with {len(ts)} rows, got shape {matrix.shape}")
    ts, matrix = _sorted(ts, matrix)
    n, k = matrix.shape
    if n == 0:
        empty = np.empty((0, k), dtype=np.float32)
        return Buckets(np.empty(0, dtype=np.int64), empty, empty, empty, 1)
    if n > 1:
        # Buckets at least as wide as the spacing of nearly every pair of snapshots (rounded down, so the grid's
        # width is never under it): a sampler's ticks jitter, and a grid of about the spacing left some buckets
        # empty and others with two snapshots, drawn as gaps where the sampler ran. After an interval change the
        # slower spacing rules, so its half of the run is not striped either.
        d = np.diff(ts)
        step = max(1, int(np.percentile(d, 95) * 1.05))
        span = int(ts[-1]) - int(ts[0]) + 1
        buckets = max(1, min(buckets, span // step))
    t0, width, starts = _grid(ts, buckets)
    slots = (ts[starts] - t0) // width
    total = int((int(ts[-1]) - t0) // width) + 1
    data = np.asfortranarray(matrix, dtype=np.float32)  # time-contiguous columns: reduceat is ~10× faster
    valid = ~np.isnan(data)
    if valid.all():
        seen = np.diff(np.r_[starts, n]).astype(np.float32)[:, None]
        sums = np.add.reduceat(data, starts, axis=0)
    else:
        seen = np.add.reduceat(valid.astype(np.float32), starts, axis=0)
        sums = np.add.reduceat(np.where(valid, data, np.float32(0)), starts, axis=0)
    out = []
    for block in (np.fmin.reduceat(data, starts, axis=0), np.fmax.reduceat(data, starts, axis=0),
                  np.divide(sums, seen, out=np.full(sums.shape, np.nan, dtype=np.float32), where=seen > 0)):
        full = np.full((total, k), np.nan, dtype=np.float32)
        full[slots] = block
        out.append(full)
    start = t0 + np.arange(total, dtype=np.int64) * width
    return Buckets(start, out[0], out[1], out[2], int(width))
