"""Statistics the rules share, as RULES.md defines them (numpy's linear percentiles), and `Distribution`:
a whole-run series kept so that its exact percentiles cost microseconds, however often they are asked."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

_MAX_BINS = 1 << 17  # grid counts span at most this many grid points (1 MB); wider series are kept sorted
_MAX_PENDING = 1024  # values waiting to be merged into the sorted ones (queries sort at most 2x this)


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


def column_medians(matrix: np.ndarray) -> np.ndarray:
    """`np.nanmedian(matrix, axis=0)` (NaN where a column has no value), exactly, without the masked arrays numpy
    uses for it: one sort of the columns (NaN last), the middle one or two values of each. ≈ 3× faster on the
    step × rank blocks Straggler reads again."""
    if not len(matrix):
        return np.full(matrix.shape[1], np.nan)
    ordered = np.sort(matrix, axis=0)
    n = np.count_nonzero(~np.isnan(matrix), axis=0)
    low = np.take_along_axis(ordered, np.maximum((n - 1) // 2, 0)[None], 0)[0]
    high = np.take_along_axis(ordered, np.maximum(n // 2, 0)[None], 0)[0]
    with np.errstate(all="ignore"):
        middle = (low + high) / 2  # numpy's mean of the two middle values (of one, itself)
    middle[n == 0] = np.nan
    return middle


def histogram(values: np.ndarray, bins: int | np.ndarray = 20, range_: tuple[float, float] | None = None) -> dict[str, Any]:
    """`probs` (fractions summing to 1) and `binedges` (len(probs) + 1) of the finite values."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"probs": [], "binedges": []}
    counts, edges = np.histogram(v, bins=bins, range=range_)
    return {"probs": (counts / counts.sum()).tolist(), "binedges": edges.tolist()}


class Distribution:
    """Every non-NaN value of a series seen so far, for exact whole-run statistics at any moment.

    Values on the store's grid (multiples of 10^-`decimals` within a span of 2^17 of them: percentages are
    stored at 0.01) are kept as counts per grid point: a node-day at 100 ms costs ~80 kB instead of 3.5 MB,
    and a percentile is a lookup. Anything else (byte rates, unrounded test data) falls back to a sorted
    array plus a small unsorted tail of new values, merged when it grows: a percentile then sorts only a
    window around its rank. Either way the statistics equal numpy's (linear percentiles) over the same
    values held in `dtype`, so one chunk or many give identical results."""

    def __init__(self, decimals: int | None = 2, dtype: Any = np.float32) -> None:
        self.dtype = np.dtype(dtype)
        self.n = 0
        self._scale = None if decimals is None else 10.0 ** decimals
        self._lo = 0  # grid code of counts[0]
        self._counts = np.zeros(0, np.int64)
        self._cum: np.ndarray | None = None
        self._sorted = np.empty(0, np.float64)
        self._pending: list[np.ndarray] = []
        self._pending_n = 0
        self._tail: np.ndarray | None = None  # the pending values, sorted (cached until the next add)

    @property
    def nbytes(self) -> int:
        """Bytes held (its arrays)."""
        return int(self._counts.nbytes + self._sorted.nbytes + sum(p.nbytes for p in self._pending))

    def _taken(self, values: np.ndarray) -> np.ndarray:
        """`values` without NaN, in `dtype`, counted in `n`."""
        v = np.asarray(values, dtype=self.dtype)
        v = v[~np.isnan(v)]
        self.n += int(v.size)
        return v

    def add(self, values: np.ndarray) -> None:
        v = self._taken(values)
        if v.size == 0:
            return
        if self._scale is not None:
            codes = self._codes(v)
            if codes is not None:
                self._count(codes)
                return
            self._leave_grid()
        self._pending.append(v.astype(np.float64))
        self._pending_n += int(v.size)
        self._tail = None
        # Small additions (live) are merged every _MAX_PENDING values, so a query sorts little; large ones
        # (a batch slice) wait until they are an eighth of the sorted values: few O(n) merges in all.
        if self._pending_n > _MAX_PENDING and (v.size < _MAX_PENDING or self._pending_n > len(self._sorted) >> 3):
            self._merge()

    def _codes(self, v: np.ndarray) -> np.ndarray | None:
        """Grid codes of `v`, or None when some value is off the grid or the span would be too wide."""
        assert self._scale is not None
        codes = np.rint(v.astype(np.float64) * self._scale)
        if not np.all(np.isfinite(codes)) or not np.array_equal((codes / self._scale).astype(self.dtype), v):
            return None
        lo = min(int(codes.min()), self._lo if self._counts.size else int(codes.min()))
        hi = max(int(codes.max()), self._lo + self._counts.size - 1 if self._counts.size else int(codes.max()))
        if hi - lo + 1 > _MAX_BINS:
            return None
        return codes.astype(np.int64)

    def _count(self, codes: np.ndarray) -> None:
        self._lo, self._counts = count_into(self._lo, self._counts, codes)
        self._cum = None

    def _grid_values(self, codes: np.ndarray) -> np.ndarray:
        assert self._scale is not None
        return (codes / self._scale).astype(self.dtype).astype(np.float64)

    def _leave_grid(self) -> None:
        """From counts to sorted values (once, when a value off the grid arrives)."""
        if self._counts.size:
            present = np.flatnonzero(self._counts)
            self._sorted = np.repeat(self._grid_values(present + self._lo), self._counts[present])
        self._scale, self._counts, self._cum = None, np.zeros(0, np.int64), None

    def _merge(self) -> None:
        """The pending values into the sorted ones: O(n + m log m), never a sort of everything."""
        if self._pending:
            tail = self._tail if self._tail is not None else np.sort(np.concatenate(self._pending))
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, tail), tail) if self._sorted.size else tail
            self._pending, self._pending_n, self._tail = [], 0, None

    def merge(self, other: Distribution) -> None:
        """Fold in `other`'s values (a Distribution of the same decimals and dtype): the statistics are then those of
        both series' values together, as if they had been added here (they are a multiset: order does not matter)."""
        if other.n == 0:
            return
        other._merge()
        values = [other._sorted]
        if other._counts.size:
            present = np.flatnonzero(other._counts)
            values.append(np.repeat(other._grid_values(present + other._lo), other._counts[present]))
        self.add(np.concatenate(values).astype(other.dtype))

    def kth(self, r: int) -> float:
        """The r-th smallest value (0-based)."""
        if self._scale is not None:
            if self._cum is None:
                self._cum = np.cumsum(self._counts)
            code = int(np.searchsorted(self._cum, r, side="right")) + self._lo
            return float(self._grid_values(np.array([code]))[0])
        if not self._pending:
            return float(self._sorted[r])
        if self._pending_n > _MAX_PENDING:  # large additions wait for a query: merged once, then looked up
            self._merge()
            return float(self._sorted[r])
        if self._tail is None:
            self._tail = np.sort(np.concatenate(self._pending))
        m = len(self._tail)
        s = max(0, r - m)  # at most m pending values precede the answer: it is within this window
        window = np.sort(np.concatenate([self._sorted[s: s + m + 1], self._tail]))
        return float(window[r - s])

    def count_le(self, x: float) -> int:
        """How many values are <= x."""
        return int(self.counts_below(np.array([x], np.float64), side="right")[0])

    def counts_below(self, edges: np.ndarray, side: str = "left") -> np.ndarray:
        """For each edge, how many values are < it (`side="left"`) or <= it ("right")."""
        edges = np.asarray(edges, np.float64)
        if self._scale is not None:
            if self._counts.size == 0:
                return np.zeros(len(edges), np.int64)
            if self._cum is None:
                self._cum = np.cumsum(self._counts)
            values = self._grid_values(np.arange(self._counts.size) + self._lo)
            at = np.searchsorted(values, edges, side=side)
            return np.where(at > 0, self._cum[np.maximum(at - 1, 0)], 0)
        if self._pending_n > _MAX_PENDING:
            self._merge()
        out = np.searchsorted(self._sorted, edges, side=side)
        if self._pending:
            if self._tail is None:
                self._tail = np.sort(np.concatenate(self._pending))
            out = out + np.searchsorted(self._tail, edges, side=side)
        return out

    def histogram(self, bins: int, upto: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """np.histogram(values, bins) of the `upto` smallest values (all by default): counts and edges,
        computed from the kept values without materialising them."""
        n = self.n if upto is None else upto
        if n <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        edges = histogram_edges(self.kth(0), self.kth(n - 1), bins)
        return histogram_counts(self.counts_below(edges[:-1], side="left"), n), edges

    def percentiles(self, qs: Iterable[float]) -> list[float]:
        """numpy's default (linear) percentiles of the values; NaN for each when there are none."""
        out = []
        for q in qs:
            if self.n == 0:
                out.append(math.nan)
                continue
            lo, hi, gamma = linear_ranks(self.n, q)
            out.append(lerp(self.kth(lo), self.kth(hi), gamma))
        return out

    def min(self) -> float:
        return self.kth(0) if self.n else math.nan

    def max(self) -> float:
        return self.kth(self.n - 1) if self.n else math.nan

    def summary(self, scale: float = 1.0) -> dict[str, float]:
        """`summary()` of the values."""
        if self.n == 0:
            return {}
        p99, p95, p50 = self.percentiles((99, 95, 50))
        return {"max": self.max() * scale, "p99": p99 * scale, "p95": p95 * scale, "p50": p50 * scale,
                "min": self.min() * scale}

    def box_stats(self) -> dict[str, float]:
        """`box_stats()` of the values."""
        if self.n == 0:
            return {}
        p25, p50, p75, p95 = self.percentiles((25, 50, 75, 95))
        iqr = p75 - p25
        return {"p25": p25, "p50": p50, "p75": p75, "p95": p95,
                "upper": float(min(p75 + 1.5 * iqr, self.max())), "lower": float(max(p25 - 1.5 * iqr, self.min()))}


class Frozen:
    """A Distribution whose values are all in (a finished node's series): the statistics its rule reads,
    computed once, and the values let go. Answers `n`, `max()`, `box_stats()` and `percentiles()` of the
    percentiles it was frozen with, exactly as the Distribution would have."""

    def __init__(self, d: Distribution, qs: tuple[float, ...] = (5.0, 95.0)) -> None:
        self.n = d.n
        self._max = d.max()
        self._percentiles = dict(zip(qs, d.percentiles(qs)))
        self._box = d.box_stats()

    def max(self) -> float:
        return self._max

    def percentiles(self, qs: Iterable[float]) -> list[float]:
        return [self._percentiles[float(q)] for q in qs]

    def box_stats(self) -> dict[str, float]:
        return dict(self._box)


def count_into(lo: int, counts: np.ndarray, codes: np.ndarray) -> tuple[int, np.ndarray]:
    """`codes` (integers) counted into `counts` (counts[i] is how often lo + i came), grown to hold them: the
    new lo and counts."""
    if not codes.size:
        return lo, counts
    c_lo, c_hi = int(codes.min()), int(codes.max())
    if counts.size == 0:
        lo, counts = c_lo, np.zeros(c_hi - c_lo + 1, np.int64)
    elif c_lo < lo or c_hi >= lo + counts.size:
        new_lo = min(c_lo, lo)
        grown = np.zeros(max(c_hi, lo + counts.size - 1) - new_lo + 1, np.int64)
        grown[lo - new_lo: lo - new_lo + counts.size] = counts
        lo, counts = new_lo, grown
    counts += np.bincount(codes - lo, minlength=counts.size)
    return lo, counts


def linear_ranks(n: int, q: float) -> tuple[int, int, float]:
    """numpy's linear percentile `q` of `n` values: the ranks (0-based) of the two values it lies between, and
    how far between."""
    virtual = (n - 1) * (float(q) / 100.0)
    lo = min(int(math.floor(virtual)), n - 1)
    return lo, min(lo + 1, n - 1), virtual - lo


def histogram_edges(first: float, last: float, bins: int) -> np.ndarray:
    """np.histogram's edges for values from `first` to `last`."""
    if first == last:  # numpy widens an empty range by 0.5 each way
        first, last = first - 0.5, last + 0.5
    return np.linspace(first, last, bins + 1, endpoint=True)


def histogram_counts(below: np.ndarray, n: int) -> np.ndarray:
    """np.histogram's counts of the `n` smallest values from how many values lie below each left edge."""
    below = np.minimum(below, n)  # larger values are not counted
    return np.diff(np.append(below, n)).astype(np.int64)  # the last bin holds its right edge


def lerp(a: float, b: float, t: float) -> float:
    """numpy's interpolation between neighbours, in its order of operations (so results match it exactly)."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


class ValueCounts(Distribution):
    """A Distribution held as its distinct values and how often each came, for whole-run series of many values
    but few distinct ones (waits in whole µs): memory grows with the distinct values, not with the count, and
    every statistic is the same as Distribution's (and numpy's) over the same values."""

    def __init__(self, dtype: Any = np.float64) -> None:
        super().__init__(None, dtype)
        self._values = np.empty(0, np.float64)
        self._vcounts = np.empty(0, np.int64)
        self._vcum: np.ndarray | None = None

    def add(self, values: np.ndarray) -> None:
        v = self._taken(values)
        if v.size == 0:
            return
        self._pending.append(v.astype(np.float64))
        self._pending_n += int(v.size)
        if self._pending_n > max(_MAX_PENDING, len(self._values)):  # merges cost O(distinct) each, rarely
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        new, counts = np.unique(np.concatenate(self._pending), return_counts=True)
        values = np.concatenate([self._values, new])
        weights = np.concatenate([self._vcounts, counts])
        self._values, inverse = np.unique(values, return_inverse=True)
        self._vcounts = np.bincount(inverse, weights=weights, minlength=len(self._values)).astype(np.int64)
        self._pending, self._pending_n, self._vcum = [], 0, None

    def merge(self, other: Distribution) -> None:
        assert isinstance(other, ValueCounts)
        other._merge()
        self._merge()
        self.n += other.n
        values, inverse = np.unique(np.concatenate([self._values, other._values]), return_inverse=True)
        weights = np.concatenate([self._vcounts, other._vcounts])
        self._vcounts = np.bincount(inverse, weights=weights, minlength=len(values)).astype(np.int64)
        self._values, self._vcum = values, None

    def _cumulative(self) -> np.ndarray:
        self._merge()
        if self._vcum is None:
            self._vcum = np.cumsum(self._vcounts)
        return self._vcum

    def kth(self, r: int) -> float:
        cum = self._cumulative()
        return float(self._values[int(np.searchsorted(cum, r, side="right"))])

    def counts_below(self, edges: np.ndarray, side: str = "left") -> np.ndarray:
        cum = self._cumulative()
        at = np.searchsorted(self._values, np.asarray(edges, np.float64), side="right" if side == "right" else "left")
        return np.where(at > 0, cum[np.maximum(at - 1, 0)], 0)
