"""StepOutlier's state per (node, rank, phase) series: step durations, exact sums, and what each step spent its
time on; held in memory (`series_facts`) or streamed (`step_stream`), with one result byte for byte."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stallwatch.analyze.rules.kit.appendable import GROWTH, Appendable, _store
from stallwatch.analyze.rules.kit.stats import Distribution
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, OPTIMIZER

MAX_LISTED = 100  # outlier steps listed per rank and phase (the slowest ones)
HISTOGRAM_BINS = 100  # SageMaker's step histogram resolution
US = 1_000_000


# Framework context of a step: the time its own events spent in each of these kinds (by `step`+`mode`).
CONTEXT_KINDS = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE)
_OTHER = len(CONTEXT_KINDS)  # any other kind with a step number
_RECORDED = _OTHER + 1  # kinds recorded per step number; "outside_phases" is derived per step
# "outside_phases": the step's time in none of its recorded events (the loop's own code between phases).
_CONTEXT_NAMES = CONTEXT_KINDS + ("other", "outside_phases")
_DENSE_SPAN = 1 << 22  # step numbers per (rank, phase) whose context is kept (from the smallest seen)


class _Series:
    """One (node, rank, phase)'s steps, kept so that `result()` costs little however many there are: exact
    integer sums for mean and std; the durations as a Distribution (percentiles, histogram, outlier count);
    every step's number, start, duration and its peers' wait for a CPU in arrival order (to name the outliers, and
    to excuse those the wait explains); and per step number the
    time its events spent in each context kind, with running totals over all steps (the normal steps'
    context is the totals minus the outliers')."""

    def __init__(self) -> None:
        self.n = self.s1 = self.s2 = 0  # Python ints: exact, whatever the order of arrival
        self.durations = Distribution(None, np.float64)  # µs
        self.step, self.start, self.dur = Appendable(narrow=True), Appendable(), Appendable(narrow=True)
        self.peer = Appendable(narrow=True)  # µs its native peers waited for a CPU (contention.peer_runq)
        self.base = 0  # step number of row 0 of the dense tables
        # per step number: µs per recorded kind, and the duration of its step (when it has one); int32 while
        # every value fits (35 minutes), int64 from the first that does not (`_store`)
        self.ctx = np.zeros((0, _RECORDED), np.int32)
        self.occ = np.zeros(0, np.int32)  # per step number: steps seen with it
        self.first = np.zeros(0, np.int32)
        self.totals = np.zeros(_RECORDED + 1, np.int64)  # over every step: µs per kind, then outside_phases
        self.duplicates = False  # a step number seen twice: outside_phases is then summed in result()

    def _dense(self, numbers: np.ndarray) -> np.ndarray:
        """Which of `numbers` have a row in the dense tables (grown to hold them, within _DENSE_SPAN)."""
        ok = numbers >= 0
        if not ok.any():
            return ok
        lo, hi = int(numbers[ok].min()), int(numbers[ok].max())
        size = len(self.occ)
        new_lo = lo if size == 0 else min(lo, self.base)
        new_hi = hi if size == 0 else max(hi, self.base + size - 1)
        new_hi = min(new_hi, new_lo + _DENSE_SPAN - 1)
        if size == 0 or new_lo < self.base or new_hi >= self.base + size:
            cap = new_hi - new_lo + 1
            if size:  # grow by a share towards higher numbers, so appends stay amortised
                cap = min(max(cap, size + size // GROWTH), _DENSE_SPAN)
            ctx, occ = np.zeros((cap, _RECORDED), self.ctx.dtype), np.zeros(cap, np.int32)
            first = np.zeros(cap, self.first.dtype)
            at = self.base - new_lo
            ctx[at: at + size], occ[at: at + size], first[at: at + size] = self.ctx, self.occ, self.first
            self.base, self.ctx, self.occ, self.first = new_lo, ctx, occ, first
        return ok & (numbers >= self.base) & (numbers < self.base + len(self.occ))

    def add_context(self, numbers: np.ndarray, kinds: np.ndarray, us: np.ndarray) -> None:
        """Events of steps: µs in kind per step number."""
        keep = self._dense(numbers)
        numbers, kinds, us = numbers[keep], kinds[keep], us[keep]
        if numbers.size == 0:
            return
        lo, hi = int(numbers.min()), int(numbers.max())
        flat = (numbers - lo) * _RECORDED + kinds
        delta = np.bincount(flat, weights=us, minlength=(hi - lo + 1) * _RECORDED)  # exact below 2^53 µs
        delta = delta.astype(np.int64).reshape(-1, _RECORDED)
        touched = np.flatnonzero(delta.any(axis=1))
        rows = touched + (lo - self.base)
        delta = delta[touched]
        before = self.ctx[rows].sum(axis=1)
        self.ctx = _store(self.ctx, rows, self.ctx[rows] + delta)
        occ = self.occ[rows].astype(np.int64)
        self.totals[:_RECORDED] += (occ[:, None] * delta).sum(axis=0)
        single = occ == 1  # steps seen more than once: outside_phases is summed in result()
        if single.any():
            d = self.first[rows[single]]
            self.totals[_RECORDED] += int((np.maximum(d - before[single] - delta[single].sum(axis=1), 0)
                                           - np.maximum(d - before[single], 0)).sum())

    def add_steps(self, numbers: np.ndarray, starts: np.ndarray, durs: np.ndarray,
                  peers: np.ndarray | None = None) -> None:
        self.n += len(durs)
        self.s1 += int(durs.sum())
        self.s2 += _sum_squares(durs)
        self.durations.add(durs)
        self.step.extend(numbers)
        self.start.extend(starts)
        self.dur.extend(durs)
        self.peer.extend(np.zeros(len(durs), np.int64) if peers is None else peers)
        keep = self._dense(numbers)
        self.totals[_RECORDED] += int(durs[~keep].sum())  # no context kept: all of it outside phases
        rows = numbers[keep] - self.base
        d = durs[keep]
        if rows.size == 0:
            return
        seen = np.bincount(rows, minlength=len(self.occ))
        if (self.occ[rows] > 0).any() or (seen > 1).any():
            self.duplicates = True
        self.occ += seen.astype(np.int32)
        self.first = _store(self.first, rows, d)  # only read while every step number has one step
        ctx = self.ctx[rows]
        self.totals[:_RECORDED] += ctx.sum(axis=0)
        self.totals[_RECORDED] += int(np.maximum(d - ctx.sum(axis=1), 0).sum())

    @property
    def nbytes(self) -> int:
        """Bytes held: its columns (with their room to grow), dense tables and durations."""
        return int(sum(c._data.nbytes for c in (self.step, self.start, self.dur, self.peer)) + self.ctx.nbytes + self.occ.nbytes
                   + self.first.nbytes + self.durations.nbytes)

    def context_of(self, rows: np.ndarray) -> np.ndarray:
        """steps (rows of the arrival-order columns) × context kinds, µs, outside_phases last."""
        numbers, durs = self.step.view()[rows], self.dur.view()[rows]
        out = np.zeros((len(rows), _RECORDED + 1), np.int64)
        ok = (numbers >= self.base) & (numbers < self.base + len(self.occ))
        out[ok, :_RECORDED] = self.ctx[numbers[ok] - self.base]
        out[:, _RECORDED] = np.maximum(durs - out[:, :_RECORDED].sum(axis=1), 0)
        return out

    def context_totals(self) -> np.ndarray:
        if not self.duplicates:
            return self.totals
        totals = self.totals.copy()
        totals[_RECORDED] = int(self.context_of(np.arange(self.n))[:, _RECORDED].sum())
        return totals


def _sum_squares(values: np.ndarray) -> int:
    """Exact sum of squares of non-negative int64 values (durations in µs), as a Python int."""
    v = np.asarray(values, np.int64)
    small = v < (1 << 31)  # squares below 2^62: summed in two 32-bit halves, which cannot overflow
    sq = (v[small] * v[small]).astype(np.uint64)
    total = (int((sq >> np.uint64(32)).sum()) << 32) + int((sq & np.uint64(0xFFFFFFFF)).sum())
    return total + sum(int(x) * int(x) for x in v[~small].tolist())


@dataclass(frozen=True)
class SeriesFacts:
    """What a (node, rank, phase) series' verdict is computed from, given its outlier threshold: the same numbers
    whether its steps were held in memory (`series_facts`) or the node was read again (`step_stream`)."""

    n: int
    s1: int  # µs, summed
    s2: int  # µs², summed
    normal: int  # steps at or under the threshold
    excused: int  # steps over it that are not once their peers' wait for a CPU is taken out (`outliers`)
    outlier_us: int  # the outliers' durations, summed
    percentiles: tuple[float, float, float]  # p99, p95, p50 (µs)
    min_us: float
    max_us: float
    histogram: tuple[np.ndarray, np.ndarray]  # counts and edges (µs) of the normal steps
    listed_steps: np.ndarray  # the slowest outliers (at most MAX_LISTED), by step number then start
    listed_us: np.ndarray
    listed_starts: np.ndarray
    outlier_context: np.ndarray  # µs per context kind over the outliers
    context_totals: np.ndarray  # … over every step


def listed(rows: np.ndarray, durs: np.ndarray) -> np.ndarray:
    """Of outlier `rows` (in step-then-start order), the MAX_LISTED slowest, in the same order (ties: the first)."""
    if rows.size <= MAX_LISTED:
        return rows
    return rows[np.sort(np.argsort(-durs[rows], kind="stable")[:MAX_LISTED])]


def outliers(durs: np.ndarray, peers: np.ndarray, limit_us: float) -> tuple[np.ndarray, int]:
    """The rows of steps over the threshold, and how many more were over it only by the time their native peers
    (the intra-op pool) waited for a CPU: on a busy machine the training thread spins at a barrier for a preempted
    peer, a slowdown of the machine's making (CPUContention's), not of the job's. A step's own time is judged; its
    peers' delay is taken out only to decide whether it is an outlier, so normal steps keep their spread."""
    over = np.flatnonzero(durs > limit_us)
    kept = over[durs[over] - np.minimum(peers[over], durs[over]) > limit_us]
    return kept, int(over.size - kept.size)


def series_facts(s: _Series, limit_us: float) -> SeriesFacts:
    """A series' facts from its steps held in memory."""
    normal = s.durations.count_le(limit_us)
    durs = s.dur.view()
    out_rows, excused = outliers(durs, s.peer.view(), limit_us)
    out_rows = out_rows[np.lexsort((s.start.view()[out_rows], s.step.view()[out_rows]))]  # step, then start
    out_sums = s.context_of(out_rows).sum(axis=0)
    shown = listed(out_rows, durs)
    return SeriesFacts(
        n=s.n, s1=s.s1, s2=s.s2, normal=normal, excused=excused, outlier_us=int(durs[out_rows].sum()),
        percentiles=tuple(s.durations.percentiles((99, 95, 50))),  # type: ignore[arg-type]
        min_us=s.durations.min(), max_us=s.durations.max(),
        histogram=s.durations.histogram(HISTOGRAM_BINS, upto=normal),
        listed_steps=s.step.view()[shown], listed_us=durs[shown], listed_starts=s.start.view()[shown],
        outlier_context=out_sums, context_totals=s.context_totals())
