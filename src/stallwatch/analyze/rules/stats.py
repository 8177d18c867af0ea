"""Statistics the rules share, as RULES.md defines them (numpy's linear percentiles)."""

from __future__ import annotations

from typing import Any

import numpy as np


def box_stats(values: np.ndarray) -> dict[str, float]:
    """p25, p50, p75, p95, upper = min(p75 + 1.5·IQR, max), lower = max(p25 − 1.5·IQR, min) of one series
    (NaN ignored); empty -> {}."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {}
    p25, p50, p75, p95 = (float(x) for x in np.percentile(v, [25, 50, 75, 95]))
    iqr = p75 - p25
    return {"p25": p25, "p50": p50, "p75": p75, "p95": p95,
            "upper": float(min(p75 + 1.5 * iqr, v.max())), "lower": float(max(p25 - 1.5 * iqr, v.min()))}


def summary(values: np.ndarray, scale: float = 1.0) -> dict[str, float]:
    """max, p99, p95, p50, min (NaN ignored), each times `scale`; empty -> {}."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {}
    p99, p95, p50 = np.percentile(v, [99, 95, 50])
    return {"max": float(v.max()) * scale, "p99": float(p99) * scale, "p95": float(p95) * scale,
            "p50": float(p50) * scale, "min": float(v.min()) * scale}


def histogram(values: np.ndarray, bins: int | np.ndarray = 20, range_: tuple[float, float] | None = None) -> dict[str, Any]:
    """`probs` (fractions summing to 1) and `binedges` (len(probs) + 1) of the finite values."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"probs": [], "binedges": []}
    counts, edges = np.histogram(v, bins=bins, range=range_)
    return {"probs": (counts / counts.sum()).tolist(), "binedges": edges.tolist()}
