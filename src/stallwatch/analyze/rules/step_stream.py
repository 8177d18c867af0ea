"""StepOutlier on a long node, in memory bounded by a block of its steps instead of all of them.

Held in memory, a node's steps cost ≈ 57 bytes each until the node is complete (≈ 0.4 GB a node-day at 10 steps/s
on 8 ranks). Where the feed can read the run again (`Chunk.replay`, batch) and a node's steps pass `NODE_BYTES`,
its series keep only what one pass can: exact sums, counts per log-linear bucket of duration, their largest
durations, and where each span of step numbers lies in time. Once the node is complete its outlier threshold is
known, and the node is read again a block of step numbers at a time: each block's steps, held as in memory (with
every event of those numbers), add up to the facts the verdict is computed from — the same numbers, so the same
result byte for byte (`tests/analyze/rules/test_step_stream.py`)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from stallwatch.analyze.framework_frame import FrameworkColumns, new_events
from stallwatch.analyze.rules.base import Replay
from stallwatch.analyze.rules.kit.appendable import Appendable
from stallwatch.analyze.rules.kit.stats import (
    ValueCounts,
    count_into,
    histogram_counts,
    histogram_edges,
    lerp,
    linear_ranks,
)
from stallwatch.analyze.rules.step_series import (
    _DENSE_SPAN,
    _RECORDED,
    HISTOGRAM_BINS,
    SeriesFacts,
    _Series,
    _sum_squares,
    listed,
    outliers,
)
from stallwatch.records import STEP

NODE_BYTES = 64 << 20  # a node's steps held in memory past which its series are streamed and the node read again
SPAN = 1024  # step numbers per span whose events' first and last start are tracked
BLOCK_STEPS = 1 << 17  # ranks × step numbers of one block read again (≈ 7 MB of its steps held)
PIECE_EVENTS = 1 << 18  # events of a node read again at once, at the node's mean rate (≈ 20 MB decoded)
TOP = 1 << 16  # largest durations kept per series: the largest normal step is among them unless more are outliers
SUB_BITS = 8  # buckets per octave of duration: 2^8 (0.4 % wide; exact below 512 µs)
PERCENTILES = (99, 95, 50)
REPLAY_FIELDS = ("kind", "mode", "step", "end_us", "args")  # args: the steps' run-queue delay (analyze/contention.py)


def bucket_of(us: np.ndarray) -> np.ndarray:
    """Each duration's log-linear bucket (monotone in the value: a larger value never has a smaller bucket)."""
    v = np.asarray(us, np.int64)
    m, e = np.frexp(np.abs(v).astype(np.float64))  # |v| = m·2^e, m in [0.5, 1): exact for |v| < 2^53
    b = e.astype(np.int64) * (1 << SUB_BITS) + np.floor(m * (1 << (SUB_BITS + 1))).astype(np.int64)
    return np.where(v < 0, -b - 1, b)


class _Buckets:
    """How many durations fell in each bucket (a dense array from the lowest bucket seen: a few thousand)."""

    def __init__(self) -> None:
        self.lo = 0
        self.counts = np.zeros(0, np.int64)

    def add(self, buckets: np.ndarray) -> None:
        self.lo, self.counts = count_into(self.lo, self.counts, np.asarray(buckets, np.int64))

    def locate(self, ranks: list[int]) -> list[tuple[int, int]]:
        """(bucket, rank within it) of each rank (0-based) of the sorted durations."""
        cum = np.cumsum(self.counts)
        out = []
        for r in ranks:
            k = int(np.searchsorted(cum, r, side="right"))
            out.append((k + self.lo, r - (int(cum[k - 1]) if k else 0)))
        return out


class StreamedSeries:
    """A (node, rank, phase) series of a long node, as one pass keeps it: what `_Series` takes (`add_steps`,
    `add_context`), reduced to a few hundred kB whatever its number of steps."""

    def __init__(self) -> None:
        self.n = self.s1 = self.s2 = 0
        self.min_us = self.max_us = 0
        self.buckets = _Buckets()
        self.top = np.empty(0, np.int64)  # the TOP largest durations, and those come since the last trim (< 2 × TOP)
        self.cut: int | None = None  # the largest duration trimmed away: every larger one is in `top`
        self.first_number: int | None = None  # the smallest step number seen: where its context window starts
        self.unnumbered = (Appendable(), Appendable(), Appendable())  # starts, durations, peers' delays: no number

    @classmethod
    def of(cls, s: _Series) -> StreamedSeries:
        """A series held in memory so far, from now on streamed."""
        out = cls()
        if len(s.occ):
            out.first_number = s.base
        out.add_steps(s.step.view(), s.start.view(), s.dur.view(), s.peer.view(), counted=(s.n, s.s1, s.s2))
        return out

    def add_context(self, numbers: np.ndarray, kinds: np.ndarray, us: np.ndarray) -> None:
        self._saw(numbers)

    def add_steps(self, numbers: np.ndarray, starts: np.ndarray, durs: np.ndarray, peers: np.ndarray | None = None,
                  counted: tuple[int, int, int] | None = None) -> None:
        if not len(durs):
            return
        durs = np.asarray(durs, np.int64)
        if counted is None:
            counted = (len(durs), int(durs.sum()), _sum_squares(durs))
        lo, hi = int(durs.min()), int(durs.max())
        self.min_us, self.max_us = (lo, hi) if self.n == 0 else (min(self.min_us, lo), max(self.max_us, hi))
        self.n, self.s1, self.s2 = self.n + counted[0], self.s1 + counted[1], self.s2 + counted[2]
        self.buckets.add(bucket_of(durs))
        self.top = np.concatenate([self.top, durs])
        if len(self.top) > 2 * TOP:
            parted = np.partition(self.top, len(self.top) - TOP)
            dropped = int(parted[: len(parted) - TOP].max())
            self.cut = dropped if self.cut is None else max(self.cut, dropped)
            self.top = parted[-TOP:]
        free = numbers < 0
        if free.any():
            self.unnumbered[0].extend(starts[free])
            self.unnumbered[1].extend(durs[free])
            self.unnumbered[2].extend(np.zeros(int(free.sum()), np.int64) if peers is None else peers[free])
        self._saw(numbers)

    def _saw(self, numbers: np.ndarray) -> None:
        ok = numbers[numbers >= 0]
        if ok.size:
            low = int(ok.min())
            self.first_number = low if self.first_number is None else min(self.first_number, low)

    def largest_normal(self, limit_us: float) -> float | None:
        """The largest duration at or under the threshold, when the kept largest durations hold it."""
        under = self.top[self.top <= limit_us]
        if self.cut is None:  # every duration is kept
            return float(under.max()) if under.size else None
        if self.cut > limit_us:  # one trimmed away may be under the threshold and above those kept
            return None
        return float(max(self.cut, int(under.max()) if under.size else self.cut))


def too_long(held: dict[tuple, Any]) -> list[tuple]:
    """Of the series held in memory (keyed by node first, each with `nbytes`), those to stream from now on: where a
    node's pass NODE_BYTES, its largest until half of that is held."""
    sizes: dict[str, list[tuple[int, tuple]]] = {}
    for key, series in held.items():
        sizes.setdefault(key[0], []).append((series.nbytes, key))
    out = []
    for node_sizes in sizes.values():
        total = sum(nbytes for nbytes, _ in node_sizes)
        if total <= NODE_BYTES:
            continue
        for nbytes, key in sorted(node_sizes, key=lambda sk: (-sk[0], sk[1])):
            if total <= NODE_BYTES // 2:
                break
            out.append(key)
            total -= nbytes
    return out


def widen(spans: dict[int, list[int]], numbers: np.ndarray, starts: np.ndarray) -> None:
    """Spans of step numbers reach out to these events (rows in time order per rank: a few runs per chunk)."""
    if not len(numbers):
        return
    span = numbers // SPAN
    heads = np.r_[0, np.flatnonzero(span[1:] != span[:-1]) + 1]
    keys, lo, hi = span[heads], np.minimum.reduceat(starts, heads), np.maximum.reduceat(starts, heads)
    if len(heads) > 256:  # numbers out of order: by span first
        keys, where = np.unique(keys, return_inverse=True)
        lo_all, hi_all = np.full(len(keys), np.iinfo(np.int64).max), np.full(len(keys), np.iinfo(np.int64).min)
        np.minimum.at(lo_all, where, lo)
        np.maximum.at(hi_all, where, hi)
        lo, hi = lo_all, hi_all
    for k, a, b in zip(keys.tolist(), lo.tolist(), hi.tolist()):
        known = spans.setdefault(k, [a, b])
        known[0], known[1] = min(known[0], a), max(known[1], b)


class _Unsorted:
    """A block's durations are read from its columns: nothing to keep in order."""

    def add(self, values: np.ndarray) -> None:
        pass


class _Windowed(_Series):
    """A block's series: context is kept only for the step numbers the whole series keeps it for."""

    def __init__(self, below: int) -> None:
        super().__init__()
        self.below = below
        self.durations = _Unsorted()  # type: ignore[assignment]

    def add_context(self, numbers: np.ndarray, kinds: np.ndarray, us: np.ndarray) -> None:
        keep = numbers < self.below
        super().add_context(numbers[keep], kinds[keep], us[keep])


class _Tally:
    """One streamed series' facts, added up block by block as its node is read again."""

    def __init__(self, s: StreamedSeries, limit_us: float) -> None:
        self.s, self.limit_us = s, limit_us
        self.normal = self.excused = self.outlier_us = 0
        self.shown: tuple[np.ndarray, np.ndarray, np.ndarray] = (np.empty(0, np.int64),) * 3  # step, µs, start
        self.out_ctx = np.zeros(_RECORDED + 1, np.int64)
        self.totals = np.zeros(_RECORDED + 1, np.int64)
        self.ranks = [(q, *linear_ranks(s.n, q)) for q in PERCENTILES]
        wanted = sorted({r for _, lo, hi, _ in self.ranks for r in (lo, hi)})
        self.where = dict(zip(wanted, s.buckets.locate(wanted)))
        self.values = {b: ValueCounts() for b, _ in self.where.values()}
        last = s.largest_normal(limit_us)  # None: more outliers than kept; a second read finds it
        self.edges = None if last is None else histogram_edges(float(s.min_us), last, HISTOGRAM_BINS)
        self.below = np.zeros(HISTOGRAM_BINS, np.int64)
        self.largest_normal = -np.inf

    def take(self, b: _Series) -> None:
        """A block's steps (every step of their numbers, with all their events)."""
        durs, numbers, starts = b.dur.view(), b.step.view(), b.start.view()
        out, excused = outliers(durs, b.peer.view(), self.limit_us)
        out = out[np.lexsort((starts[out], numbers[out]))]  # step, then start
        self.normal += len(durs) - len(out) - excused
        self.excused += excused
        self.outlier_us += int(durs[out].sum())
        self.out_ctx += b.context_of(out).sum(axis=0)
        self.totals += b.context_totals()
        rows = listed(out, durs)
        merged = [np.concatenate([had, new[rows]]) for had, new in zip(self.shown, (numbers, durs, starts))]
        keep = listed(np.arange(len(merged[0])), merged[1])  # the slowest of the earlier blocks' and this one's
        self.shown = (merged[0][keep], merged[1][keep], merged[2][keep])
        normal = durs[durs <= self.limit_us]
        if normal.size:
            self.largest_normal = max(self.largest_normal, float(normal.max()))
        buckets = bucket_of(durs)
        for bucket, counts in self.values.items():
            counts.add(durs[buckets == bucket].astype(np.float64))
        self.count_below(durs)

    def count_below(self, durs: np.ndarray) -> None:
        if self.edges is not None:
            self.below += np.searchsorted(np.sort(durs.astype(np.float64)), self.edges[:-1], side="left")

    def kth(self, r: int) -> float:
        bucket, at = self.where[r]
        return self.values[bucket].kth(at)

    def facts(self) -> SeriesFacts:
        assert self.edges is not None
        s = self.s
        return SeriesFacts(
            n=s.n, s1=s.s1, s2=s.s2, normal=self.normal, excused=self.excused, outlier_us=self.outlier_us,
            percentiles=tuple(lerp(self.kth(lo), self.kth(hi), gamma) for _, lo, hi, gamma in self.ranks),  # type: ignore[arg-type]
            min_us=float(s.min_us), max_us=float(s.max_us),
            histogram=(histogram_counts(self.below, self.normal), self.edges) if self.normal
            else (np.zeros(0, np.int64), np.zeros(0, np.float64)),
            listed_steps=self.shown[0], listed_us=self.shown[1], listed_starts=self.shown[2],
            outlier_context=self.out_ctx, context_totals=self.totals)


def node_facts(node: str, streamed: dict[tuple[str, int, str], StreamedSeries], spans: dict[str, dict[int, list[int]]],
               replay: Replay, limit_of: Callable[[StreamedSeries], float],
               add_events: Callable[[FrameworkColumns, Callable[[tuple], Any]], None],
               piece_us: int) -> dict[tuple, SeriesFacts]:
    """The facts of a complete node's streamed series: its steps without a number, then its events read again a
    block of step numbers at a time, per phase (`spans`: per phase, where each span of numbers lies in time), in
    pieces of at most `piece_us`. `add_events(cols, series_of)` hands events to the series `series_of(key)` gives
    (None: none)."""
    tallies = {key: _Tally(s, limit_of(s)) for key, s in streamed.items() if s.n}
    for t in tallies.values():
        starts, durs, peers = t.s.unnumbered
        if starts.n:  # they come first in step order
            block = _Series()
            block.add_steps(np.full(starts.n, -1, np.int64), starts.view(), durs.view(), peers.view())
            t.take(block)
    for mode in sorted({key[2] for key in tallies}):
        keys = {key: t for key, t in tallies.items() if key[2] == mode}
        plan = _plan(node, spans.get(mode, {}), len(keys), piece_us)
        for lo, hi, pieces in _read(replay, plan, kinds=None):
            blocks: dict[tuple, _Series] = {}

            def series_of(key: tuple, lo: int = lo, hi: int = hi) -> Any:
                t = keys.get(key)
                if t is None:
                    return None
                if key not in blocks:
                    first = t.s.first_number if t.s.first_number is not None else 0
                    blocks[key] = _Windowed(first + _DENSE_SPAN)
                return _Within(blocks[key], lo, hi)

            for cols in pieces:
                add_events(cols, series_of)
            for key, b in blocks.items():
                keys[key].take(b)
        late = {key: t for key, t in keys.items() if t.edges is None}
        if late:  # more outliers than the largest durations kept: the histogram's range is known only now
            for t in late.values():
                t.edges = histogram_edges(float(t.s.min_us), t.largest_normal, HISTOGRAM_BINS)
            for t in late.values():
                t.count_below(t.s.unnumbered[1].view())
            for lo, hi, pieces in _read(replay, plan, kinds=(STEP,)):
                step_only: dict[tuple, _Series] = {key: _Windowed(0) for key in late}
                for cols in pieces:
                    add_events(cols, lambda key, lo=lo, hi=hi: _Within(step_only[key], lo, hi) if key in late else None)
                for key, t in late.items():
                    t.count_below(step_only[key].dur.view())
    return {key: t.facts() for key, t in tallies.items()}


class _Within:
    """A block's series that takes only the events of step numbers in [lo, hi)."""

    def __init__(self, series: _Series, lo: int, hi: int) -> None:
        self.series, self.lo, self.hi = series, lo, hi

    def add_context(self, numbers: np.ndarray, kinds: np.ndarray, us: np.ndarray) -> None:
        keep = (numbers >= self.lo) & (numbers < self.hi)
        if keep.any():
            self.series.add_context(numbers[keep], kinds[keep], us[keep])

    def add_steps(self, numbers: np.ndarray, starts: np.ndarray, durs: np.ndarray,
                  peers: np.ndarray | None = None) -> None:
        keep = (numbers >= self.lo) & (numbers < self.hi)
        if keep.any():
            self.series.add_steps(numbers[keep], starts[keep], durs[keep], None if peers is None else peers[keep])


def _plan(node: str, spans: dict[int, list[int]], ranks: int,
          piece_us: int) -> list[tuple[int, int, list[tuple[str, int, int]]]]:
    """Blocks of step numbers (first, end) and the pieces of the node to read for each: from the first to the last
    start of the events of its numbers, at most `piece_us` a piece. A block holds BLOCK_STEPS ranks × numbers (at
    least a span)."""
    per = max(1, BLOCK_STEPS // max(ranks, 1) // SPAN)  # spans per block
    blocks: list[list[int]] = []  # first number, first start, last start
    for k, (a, b) in sorted(spans.items()):
        first = k // per * per * SPAN
        if blocks and blocks[-1][0] == first:
            blocks[-1][1], blocks[-1][2] = min(blocks[-1][1], a), max(blocks[-1][2], b)
        else:
            blocks.append([first, a, b])
    piece_us = max(int(piece_us), 1)
    return [(first, first + per * SPAN, [(node, t, min(t + piece_us, b + 1)) for t in range(a, b + 1, piece_us)])
            for first, a, b in blocks]


def _read(replay: Replay, plan: list[tuple[int, int, list[tuple[str, int, int]]]],
          kinds: tuple[str, ...] | None) -> Iterator[tuple[int, int, list[FrameworkColumns]]]:
    """Per block: its numbers and a reader of its pieces' events, one piece at a time (read a piece ahead)."""
    chunks = replay([piece for _, _, pieces in plan for piece in pieces], kinds=kinds, fields=REPLAY_FIELDS)
    for lo, hi, pieces in plan:
        yield lo, hi, _Pieces(chunks, len(pieces))


class _Pieces:
    """The events of a block's pieces, decoded as the rules read them, one piece at a time."""

    def __init__(self, chunks: Iterator[Any], count: int) -> None:
        self.chunks, self.count = chunks, count

    def __iter__(self) -> Iterator[FrameworkColumns]:
        for _ in range(self.count):
            cols = new_events(next(self.chunks))
            if cols is not None:
                yield cols
