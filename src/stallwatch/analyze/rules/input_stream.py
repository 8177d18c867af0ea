"""InputBound on a long node, in memory bounded by a block of its steps instead of all of them.

Held in memory, a rank's steps and waits cost ≈ 25 bytes a step until its node is complete (≈ 170 MB a node-day at
10 steps/s on 8 ranks). Where the feed can read the run again (`Chunk.replay`) and a node's steps pass
`step_stream.NODE_BYTES`, its ranks keep only their step count, counts per bucket of step duration and of
recorded wait, and where each span of step numbers lies in time. Once the node is complete it is read again, a
block of step numbers at a time, in step order (each block's steps with all their waits, settled as in memory): it
slides the windows, counts the waits per bucket and gathers those where the median wait and the stall threshold
should be (from the waits as recorded); where the settled waits put them elsewhere, a second read gathers there.
The entry is the in-memory one byte for byte (`tests/analyze/rules/test_input_stream.py`), judged like it on the steps'
own time: each step's run-queue delay is taken out of its duration and its wait (analyze/contention.py), the
duration buckets counted of own times, the stalls found by the least of their wait that was the loader's."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from stallwatch.analyze import contention
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.rules.base import Replay
from stallwatch.analyze.rules.input_facts import (
    MAX_NAMED,
    MIN_SHORT_RUN_STEPS,
    STALL_FACTOR,
    STALL_SHARE,
    STALL_STEP_SHARE,
    US,
    RankFacts,
    settled_steps,
)
from stallwatch.analyze.rules.step_stream import _Buckets, _plan, _read, bucket_of
from stallwatch.records import DATA_WAIT, STEP


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """The smallest value of a (non-negative) bucket and the bound above its values."""
    if bucket <= 0:  # bucket 0 holds 0 alone
        return 0.0, 1.0
    e, f = bucket // 256 - 1, bucket % 256 + 256  # `bucket_of`: e · 256 + f, f in [256, 512)
    return float(np.ldexp(float(f), e - 9)), float(np.ldexp(float(f + 1), e - 9))


class StreamedRank:
    """A (node, rank, phase) of a long node, as one pass keeps it."""

    def __init__(self) -> None:
        self.n = 0
        self.waits = 0  # wait events seen (a rank whose waits are not recorded is judged only with some)
        self.durations = _Buckets()
        self.raw = _Buckets()  # waits above zero as recorded (one a step, usually: where its median should be)

    @classmethod
    def of(cls, r: Any) -> StreamedRank:
        """A rank held in memory so far (`input_bound._Rank`), from now on streamed: its steps' own times."""
        out = cls()
        dur = r.dur.view()
        out.add_steps(contention.own_time(dur, r.runq.view()) if r.runq.n == len(dur) else dur)
        out.add_waits(r.wait.view())
        return out

    def add_waits(self, durs: np.ndarray) -> None:
        self.waits += len(durs)
        self.raw.add(bucket_of(durs[durs > 0]))

    def add_steps(self, durs: np.ndarray) -> None:
        """Steps' own times (their duration less their run-queue delay), as the judged steps will have them."""
        self.n += len(durs)
        self.durations.add(bucket_of(durs))


def _kth(buckets: _Buckets, gathered: _Gather, r: int) -> int:
    """The r-th smallest value (0-based) from bucket counts and the values gathered from its bucket."""
    (bucket, at), = buckets.locate([r])
    values, counts = gathered.distinct()
    mine = bucket_of(values) == bucket
    return int(values[mine][int(np.searchsorted(np.cumsum(counts[mine]), at, side="right"))])


def _median(buckets: _Buckets, gathered: _Gather, n: int) -> float:
    """np.median of n values known by bucket counts, from the values gathered from the middle buckets."""
    return float(np.median(np.array([_kth(buckets, gathered, (n - 1) // 2), _kth(buckets, gathered, n // 2)],
                                    np.int64)))


def _middle(buckets: _Buckets, n: int) -> np.ndarray:
    """The buckets of the middle values (one or two)."""
    return np.array(sorted({b for b, _ in buckets.locate(sorted({(n - 1) // 2, n // 2}))}), np.int64)


class _Gather:
    """The values that fall in some buckets, as distinct values and how often each came: a bucket is 0.4 % wide,
    so it holds at most that many distinct µs values (≈ 400 at 100 ms), however many steps fall in it."""

    def __init__(self, buckets: np.ndarray) -> None:
        self.buckets = buckets
        self.values, self.counts = np.empty(0, np.int64), np.empty(0, np.int64)
        self.parts: list[np.ndarray] = []
        self.pending = 0

    def add(self, values: np.ndarray) -> None:
        if self.buckets.size and values.size:
            picked = values[np.isin(bucket_of(values), self.buckets)]
            if picked.size:
                self.parts.append(picked.astype(np.int64))
                self.pending += picked.size
                if self.pending > max(1 << 16, len(self.values)):
                    self.distinct()

    def distinct(self) -> tuple[np.ndarray, np.ndarray]:
        """The sorted distinct values and their counts."""
        if self.parts:
            new, counts = np.unique(np.concatenate(self.parts), return_counts=True)
            values = np.concatenate([self.values, new])
            self.values, where = np.unique(values, return_inverse=True)
            self.counts = np.bincount(where, weights=np.concatenate([self.counts, counts]),
                                      minlength=len(self.values)).astype(np.int64)
            self.parts, self.pending = [], 0
        return self.values, self.counts

    def above(self, threshold: float) -> tuple[int, int]:
        """How many of the values are above `threshold`, and their sum."""
        values, counts = self.distinct()
        over = values > threshold
        return int(counts[over].sum()), int((values[over] * counts[over]).sum())


class _Scan:
    """One rank's steps in step order, block by block: totals, the sliding windows after `patience`, and its waits
    counted and summed per bucket (all of them, and those past the warm-up), with the largest past the warm-up."""

    def __init__(self, s: StreamedRank, window: int, patience: int, threshold: float, named: int) -> None:
        self.s, self.window, self.threshold, self.named = s, window, threshold, named
        n = s.n
        self.body = min(patience, n)
        self.k = min(window, n - self.body)
        self.at = 0  # steps seen
        self.wait_sum = self.dur_sum = 0
        self.above = 0
        self.best: tuple[float, int, int, int, int] | None = None  # share, first and last step, start, end
        self.carry: tuple[np.ndarray, ...] = (np.empty(0, np.int64),) * 4  # the body's last k - 1 steps
        self.positive = _Buckets()  # waits above zero
        self.late = _Buckets()  # waits past the warm-up (stalls are among them)
        self.late_sums: dict[int, int] = {}
        self.top: tuple[np.ndarray, ...] = (np.empty(0, np.int64),) * 3  # largest late waits: wait, position, number
        self.warmup = self.body if self.body < n else 0
        self.durs = _Gather(_middle(s.durations, n))
        self.median_d = 0.0
        # The first read gathers the waits where the median wait and the stall threshold should be, from the waits
        # as recorded; when the settled waits put them there, no second read is needed.
        self.waits = self.candidates = _Gather(np.empty(0, np.int64))
        self.late_last = 0  # the last bucket gathered for the stall threshold (every later one is above it)
        raw = int(s.raw.counts.sum())
        if raw:
            middle = _middle(s.raw, raw)
            self.waits = _Gather(np.arange(middle[0] - 2, middle[-1] + 3, dtype=np.int64))
            d_middle = _middle(s.durations, n)
            self._threshold_buckets(bucket_bounds(int(self.waits.buckets[0]))[0],
                                    bucket_bounds(int(self.waits.buckets[-1]))[1],
                                    bucket_bounds(int(d_middle[0]))[0], bucket_bounds(int(d_middle[-1]))[1])

    def take(self, number: np.ndarray, start: np.ndarray, dur: np.ndarray, wait: np.ndarray,
             floor: np.ndarray, plain: np.ndarray) -> None:
        """The next steps in step order (a block's, settled: own times, waits, the least of each wait that was the
        loader's, `floor`, which stalls are judged on, and the own times a stall is measured against, `plain`)."""
        pos = self.at + np.arange(len(number))
        self.at += len(number)
        self.wait_sum += int(wait.sum())
        self.dur_sum += int(dur.sum())
        self.durs.add(plain)
        self.positive.add(bucket_of(wait[wait > 0]))
        late = pos >= self.warmup
        lw = floor[late]
        self.waits.add(wait[wait > 0])
        self.candidates.add(lw)
        if lw.size:
            b = bucket_of(lw)
            self.late.add(b)
            uniq, where = np.unique(b, return_inverse=True)
            for bucket, total in zip(uniq.tolist(), np.bincount(where, weights=lw.astype(np.float64)).tolist()):
                self.late_sums[bucket] = self.late_sums.get(bucket, 0) + int(total)  # exact: sums below 2^53 µs
            w, p, k = (np.concatenate([had, new]) for had, new in zip(self.top, (lw, pos[late], number[late])))
            order = np.lexsort((p, -w))[: self.named]
            self.top = (w[order], p[order], k[order])
        self._windows(pos, number, start, dur, wait)

    def _windows(self, pos: np.ndarray, number: np.ndarray, start: np.ndarray, dur: np.ndarray,
                 wait: np.ndarray) -> None:
        body = pos >= self.body
        k = self.k
        if not body.any() or k < 1:
            return
        cols = [np.concatenate([c, new[body]]) for c, new in zip(self.carry, (number, start, dur, wait))]
        if len(cols[0]) >= k:
            cw, cd = np.r_[0, np.cumsum(cols[3])], np.r_[0, np.cumsum(cols[2])]
            wsum, dsum = cw[k:] - cw[:-k], cd[k:] - cd[:-k]
            with np.errstate(invalid="ignore", divide="ignore"):
                share = np.where(dsum > 0, 100.0 * wsum / np.maximum(dsum, 1), 0.0)
            self.above += int(np.count_nonzero(share > self.threshold))
            i = int(np.argmax(share))
            if self.best is None or share[i] > self.best[0]:  # the first of equal windows
                z = i + k - 1
                self.best = (float(share[i]), int(cols[0][i]), int(cols[0][z]), int(cols[1][i]),
                             int(cols[1][z] + cols[2][z]))
        self.carry = tuple(c[max(len(c) - (k - 1), 0):] if k > 1 else c[:0] for c in cols)

    def _threshold_buckets(self, w_lo: float, w_hi: float, d_lo: float, d_hi: float) -> None:
        """Gather the buckets the stall threshold falls in for a median wait in [w_lo, w_hi) and a median step in
        [d_lo, d_hi)."""
        t_lo = max(STALL_FACTOR * w_lo, STALL_STEP_SHARE * d_lo)
        t_hi = max(STALL_FACTOR * w_hi, STALL_STEP_SHARE * d_hi)
        first, last = (int(b) for b in bucket_of(np.array([int(np.floor(t_lo)), int(np.ceil(t_hi))], np.int64)))
        self.candidates = _Gather(np.arange(first, last + 1, dtype=np.int64))
        self.late_last = last

    def settle(self) -> bool:
        """After the first read: the exact median step; True when the median wait or the stall threshold is not
        where the first read gathered, and so a second read must gather there."""
        self.median_d = _median(self.s.durations, self.durs, self.s.n)
        positives = int(self.positive.counts.sum())
        if not positives:
            return False
        middle = _middle(self.positive, positives)
        if np.isin(middle, self.waits.buckets).all():
            threshold = max(STALL_FACTOR * _median(self.positive, self.waits, positives),
                            STALL_STEP_SHARE * self.median_d)
            at = bucket_of(np.array([int(np.floor(threshold)), int(np.ceil(threshold))], np.int64))
            if np.isin(at, self.candidates.buckets).all():
                return False
        self.waits = _Gather(middle)
        self._threshold_buckets(bucket_bounds(int(middle[0]))[0], bucket_bounds(int(middle[-1]))[1],
                                self.median_d, self.median_d)
        self.at = 0
        return True

    def gather(self, wait: np.ndarray, floor: np.ndarray) -> None:
        """The second read's steps (in the same order): the values of the gathered buckets."""
        pos = self.at + np.arange(len(wait))
        self.at += len(wait)
        self.waits.add(wait[wait > 0])
        self.candidates.add(floor[pos >= self.warmup])

    def facts(self) -> RankFacts:
        n = self.s.n
        worst = None
        if self.best is not None:
            share, first, last, start, end = self.best
            worst = {"share": share, "first_step": first, "last_step": last, "start_us": start, "end_us": end,
                     "steps": self.k}
        judged = n - self.body >= self.window or n - self.body >= MIN_SHORT_RUN_STEPS
        stalls = None
        named: list[int] = []
        stalled = False
        positives = int(self.positive.counts.sum())
        if positives:
            median = _median(self.positive, self.waits, positives)
            count, total = self.candidates.above(max(STALL_FACTOR * median, STALL_STEP_SHARE * self.median_d))
            for bucket, c in zip(range(self.late.lo, self.late.lo + len(self.late.counts)), self.late.counts.tolist()):
                if bucket > self.late_last and c:  # every wait of these buckets is above the threshold
                    count += c
                    total += self.late_sums[bucket]
            stall_wait = float(total)
            stalls = {"median_wait_ms": median / 1000.0, "stalls": count, "stall_wait_s": stall_wait / US}
            if count and stall_wait >= STALL_SHARE * float(self.wait_sum):
                w, _, numbers = self.top
                stalled = True
                stall = (w > STALL_FACTOR * median) & (w > STALL_STEP_SHARE * self.median_d)
                named = sorted(int(x) for x in numbers[stall])
        return RankFacts(n=n, wait_us=self.wait_sum, step_us=self.dur_sum, body=self.body, worst=worst,
                         above=self.above if judged else 0, stalls=stalls, named=named, stalled=stalled)


def node_facts(node: str, streamed: dict[tuple[str, int, str], StreamedRank], spans: dict[str, dict[int, list[int]]],
               replay: Replay, params: dict[str, Any], steps_of: Callable[[Any], tuple], new_rank: Callable[[], Any],
               piece_us: int, delay_of: Callable[[tuple, np.ndarray, np.ndarray], np.ndarray | None] | None = None
               ) -> dict[tuple, RankFacts]:
    """The facts of a complete node's streamed ranks, read again twice a block of step numbers at a time (per
    phase; `spans`: where each span of numbers lies in time, per phase), in pieces of at most `piece_us`.
    `steps_of(rank)` settles a block's `_Rank` (made by `new_rank()`) into its steps in step order, with their
    run-queue delays (`input_bound._Rank.steps_and_runq`); `delay_of(key, starts, durations)`, its workers' wait for
    a CPU others held (`contention.workers_delay`)."""
    scans = {key: _Scan(s, params["window"], params["patience"], float(params["threshold"]), MAX_NAMED)
             for key, s in streamed.items() if s.n}
    out: dict[tuple, RankFacts] = {}
    for mode in sorted({key[2] for key in scans}):
        keys = {key: scan for key, scan in scans.items() if key[2] == mode}
        plan = _plan(node, spans.get(mode, {}), len(keys), piece_us)
        for number, start, dur, wait, floor, plain, key in _blocks(replay, plan, keys, steps_of, new_rank, delay_of):
            keys[key].take(number, start, dur, wait, floor, plain)
        again = {key: scan for key, scan in keys.items() if scan.settle()}
        if again:
            for _, _, _, wait, floor, _, key in _blocks(replay, plan, again, steps_of, new_rank, delay_of):
                again[key].gather(wait, floor)
        for key, scan in keys.items():
            out[key] = scan.facts()
    return out


def _blocks(replay: Replay, plan: list, keys: dict, steps_of: Callable[[Any], tuple],
            new_rank: Callable[[], Any], delay_of: Callable[..., np.ndarray | None] | None = None
            ) -> Iterator[tuple[Any, ...]]:
    """Each block's steps of each key, settled, in step order: (numbers, starts, own times, waits, the waits' part
    that was the loader's, the own times before the workers' delay, key), as `input_facts.rank_facts` judges them (a step without run-queue delay is its
    own; so a block's steps settle alone)."""
    for lo, hi, pieces in _read(replay, plan, kinds=(STEP, DATA_WAIT)):
        ranks: dict[tuple, Any] = {}
        for cols in pieces:
            _add(cols, lo, hi, keys, ranks, new_rank)
        for key in sorted(ranks):
            number, start, dur, wait, runq, in_wait = steps_of(ranks[key])
            workers = delay_of(key, start, dur) if delay_of is not None else None
            dur, wait, floor, plain = settled_steps(dur, wait, runq, in_wait, workers)
            yield number, start, dur, wait, floor, plain, key


def _add(cols: FrameworkColumns, lo: int, hi: int, keys: dict, ranks: dict, new_rank: Callable[[], Any]) -> None:
    within = (cols.step >= lo) & (cols.step < hi)
    for kind, attrs in ((STEP, ("step", "start", "dur")), (DATA_WAIT, ("wait_step", "wait"))):
        for key, rows in cols.groups(cols.kind_is(kind) & within):
            if key not in keys:
                continue
            r = ranks.get(key)
            if r is None:
                r = ranks[key] = new_rank()
            dur = np.maximum(cols.end[rows] - cols.start[rows], 0)
            values = (cols.step[rows], cols.start[rows], dur) if kind == STEP else (cols.step[rows], dur)
            for attr, v in zip(attrs, values):
                getattr(r, attr).extend(v)
            if kind == STEP:
                r.runq.extend(contention.step_runq(cols, rows))
                r.in_wait.extend(contention.wait_runq(cols, rows))
