"""Straggler: in a distributed job, which rank (or node) holds the others back. Every rank's step time looks the
same, because the fast ranks wait inside the collectives for the slow one; what differs is the time each rank
spends *outside* that waiting. Per step, each rank's time outside collective waits is compared with the median
over the other ranks; a rank whose excess stays above the threshold over a window of steps is a straggler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from stallwatch.analyze import contention
from stallwatch.analyze.finding import LISTED_WINDOWS, Finding, Where, finding, over_all_steps
from stallwatch.analyze.framework_frame import new_events
from stallwatch.analyze.rules import straggler_excess
from stallwatch.analyze.rules.base import Chunk, Replay, Rule, RuleResult
from stallwatch.analyze.rules.kit.appendable import Appendable
from stallwatch.analyze.rules.kit.checks import check_counts, check_non_negative
from stallwatch.analyze.rules.kit.details import DetailsRecord
from stallwatch.analyze.rules.kit.stats import column_medians
from stallwatch.analyze.rules.straggler_excess import _excess, _stake, _Summary, own_outside
from stallwatch.analyze.rules.straggler_replay import _Replayed
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import BACKWARD, COLLECTIVE, STEP, TRAIN

US = 1_000_000
MIN_SHARED_STEPS = 10  # steps seen on at least two ranks before anything is judged
COVERED = 0.5  # collectives recorded in at least this share of a rank's steps: their time is the wait


@dataclass(frozen=True)
class StragglerEntry(DetailsRecord):
    """A rank that fell behind: its mean excess over the others per step (s) and share of its step time (%), over
    how many steps, and since which step (number, µs since the epoch)."""

    node: str = ""
    rank: int | None = None
    excess_s_per_step: float | None = None
    share: float | None = None
    steps: int = 0
    since_step: int | None = None
    since_us: int | None = None

    @property
    def key(self) -> str:
        return f"{self.node}/{self.rank}"


@dataclass(frozen=True)
class StragglerDetails(DetailsRecord):
    """Straggler's Details: the stragglers, per rank its comparison with the others (kept as stored), the nodes
    that hold stragglers, the time at stake (s), the steps shared by ranks, the median step (s) and the finding's
    title."""

    rule = "Straggler"
    stragglers: list[StragglerEntry] = field(default_factory=list)
    ranks: dict[str, dict[str, Any]] = field(default_factory=dict)
    straggling_nodes: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    ranks_fired: list[str] = field(default_factory=list)
    time_at_stake_s: float | None = None
    shared_steps: int = 0
    median_step_s: float | None = None
    title: str | None = None


class _Rank:
    """One rank's TRAIN steps (number, start, duration) and, per step number, its collective and backward time;
    where the run can be read again (`Chunk.replay`), also where each span of its step numbers lies in time."""

    def __init__(self, replayable: bool = False) -> None:
        self.step, self.start, self.dur = Appendable(narrow=True), Appendable(), Appendable(narrow=True)
        self.runq = Appendable(narrow=True)  # each step's run-queue delay (µs), beside its duration
        self.coll_step, self.coll = Appendable(narrow=True), Appendable(narrow=True)
        self.bwd_step, self.bwd = Appendable(narrow=True), Appendable(narrow=True)
        self.spans: dict[int, list[int]] | None = {} if replayable else None  # span -> [first, last start]
        # once the run will be read again (`Straggler._replaying`), only what its `_Summary` needs: the step
        # numbers of its steps, collectives and backward passes, as runs (the columns above stay empty)
        self.runs: dict[str, np.ndarray] | None = None

    @property
    def nbytes(self) -> int:
        return sum(c._data.nbytes for c in (self.step, self.start, self.dur, self.runq, self.coll_step, self.coll,
                                            self.bwd_step, self.bwd))

    @property
    def has_steps(self) -> bool:
        return bool(self.step.n) if self.runs is None else bool(len(self.runs[STEP]))

    def keep_numbers_only(self) -> None:
        """From now on only the step numbers (as runs): the columns are let go."""
        self.runs = {STEP: _numbers_as_runs(self.step.view()), COLLECTIVE: _numbers_as_runs(self.coll_step.view()),
                     BACKWARD: _numbers_as_runs(self.bwd_step.view())}
        for name in ("step", "start", "dur", "runq", "coll_step", "coll", "bwd_step", "bwd"):
            setattr(self, name, Appendable(narrow=True))

    def add_numbers(self, kind: str, numbers: np.ndarray) -> None:
        assert self.runs is not None
        self.runs[kind] = _union(np.concatenate([self.runs[kind], _numbers_as_runs(numbers)]))

    def summary(self) -> _Summary:
        """`_summary` of a rank kept as numbers only."""
        assert self.runs is not None
        steps = self.runs[STEP]
        total = int(steps[:, 1].sum())

        def covered(kind: str) -> bool:
            other = self.runs[kind]  # type: ignore[index]
            return bool(len(other)) and _overlap(steps, other) >= COVERED * total

        spans = sorted((self.spans or {}).items())
        rows = np.array([[k, a, b] for k, (a, b) in spans], np.int64).reshape(-1, 3)
        return _Summary(steps, covered(COLLECTIVE), covered(BACKWARD), rows)

    def widen(self, steps: np.ndarray, starts: np.ndarray) -> None:
        """Spans of step numbers reach out to these events (a few spans per chunk)."""
        if self.spans is None or not len(steps):
            return
        span, where = np.unique(steps // straggler_excess.SPAN, return_inverse=True)
        lo, hi = np.full(len(span), np.iinfo(np.int64).max), np.full(len(span), np.iinfo(np.int64).min)
        np.minimum.at(lo, where, starts)
        np.maximum.at(hi, where, starts)
        for k, a, b in zip(span.tolist(), lo.tolist(), hi.tolist()):
            known = self.spans.setdefault(k, [a, b])
            known[0], known[1] = min(known[0], a), max(known[1], b)
KEEP_BYTES = 128 << 20  # kept steps of finished ranks (≈ 8 bytes a rank-step) beyond which they are let go
NODE_BYTES = 64 << 20  # … and the columns of the node being read (≈ 25 bytes a rank-step) beyond which likewise


@dataclass(frozen=True)
class _Steps:
    """A rank's steps once its node is complete: one row per step number (its first step), in the narrowest
    integer type that holds them exactly, the numbers as runs of consecutive ones (≈ 4–12 bytes a step instead
    of ≈ 50 in growable columns of events; each number's earliest start is kept once for all ranks, in
    `_Starts`). Ranks are compared step by step across nodes at the end, so the rows are kept until then."""

    runs: np.ndarray  # the sorted, distinct step numbers as runs: rows of (first number, length)
    dur: np.ndarray  # µs
    coll: np.ndarray | None  # µs in collectives per step; None when they are recorded in too few of its steps
    bwd: np.ndarray | None  # µs in backward per step; likewise
    runq: np.ndarray | None = None  # µs its training thread waited for a CPU per step; None when it never did

    def numbers(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The step numbers of rows [lo, hi), int64."""
        hi = len(self.dur) if hi is None else hi
        if hi <= lo:
            return np.empty(0, np.int64)
        lengths = self.runs[:, 1]
        ends = np.cumsum(lengths)
        offsets = ends - lengths  # row of each run's first number
        rows = np.arange(lo, hi, dtype=np.int64)
        k = np.searchsorted(ends, rows, side="right")
        return self.runs[k, 0] + (rows - offsets[k])

    def locate(self, values: np.ndarray) -> np.ndarray:
        """Row where each value is or would be (`np.searchsorted(numbers, values)`, without the numbers)."""
        values = np.asarray(values, np.int64)
        if not len(self.runs):
            return np.zeros(len(values), np.int64)
        firsts, lengths = self.runs[:, 0], self.runs[:, 1]
        offsets = np.r_[0, np.cumsum(lengths)[:-1]]
        k = np.searchsorted(firsts, values, side="right") - 1
        inside = np.clip(values - firsts[np.maximum(k, 0)], 0, lengths[np.maximum(k, 0)])
        return np.where(k < 0, 0, offsets[np.maximum(k, 0)] + inside)


def _numbers_as_runs(numbers: np.ndarray) -> np.ndarray:
    """Any step numbers as runs of their sorted distinct values."""
    return _runs(np.unique(np.asarray(numbers, np.int64)))


def _union(runs: np.ndarray) -> np.ndarray:
    """Runs (rows of first, length; any order, overlapping) as the sorted, disjoint runs of the same numbers."""
    runs = runs.reshape(-1, 2)
    if not len(runs):
        return np.zeros((0, 2), np.int64)
    order = np.argsort(runs[:, 0], kind="stable")
    first, end = runs[order, 0], runs[order, 0] + runs[order, 1]
    reach = np.maximum.accumulate(end)
    heads = np.flatnonzero(np.r_[True, first[1:] > reach[:-1]])  # a run that neither overlaps nor touches the last
    ends = np.maximum.reduceat(end, heads)
    return np.stack([first[heads], ends - first[heads]], axis=1).astype(np.int64)


def _overlap(a: np.ndarray, b: np.ndarray) -> int:
    """How many numbers the disjoint sorted runs `a` and `b` share."""
    firsts, lengths = a[:, 0], a[:, 1]
    before = np.r_[0, np.cumsum(lengths)]

    def below(t: np.ndarray) -> np.ndarray:  # numbers of `a` smaller than each t
        k = np.searchsorted(firsts, t, side="left")
        part = np.where(k > 0, np.minimum(lengths[np.maximum(k - 1, 0)], t - firsts[np.maximum(k - 1, 0)]), 0)
        return np.where(k > 0, before[np.maximum(k - 1, 0)] + part, 0)

    return int((below(b[:, 0] + b[:, 1]) - below(b[:, 0])).sum())


def _runs(number: np.ndarray) -> np.ndarray:
    """Sorted distinct numbers as rows of (first, length) of consecutive runs."""
    if not len(number):
        return np.zeros((0, 2), np.int64)
    starts = np.flatnonzero(np.r_[True, np.diff(number) != 1])
    lengths = np.diff(np.r_[starts, len(number)])
    return np.stack([number[starts].astype(np.int64), lengths.astype(np.int64)], axis=1)


class _Starts:
    """Each step number's earliest start over every rank compacted so far (what the result reports a window's
    start by), kept once for all ranks: sorted numbers and their starts."""

    def __init__(self) -> None:
        self.numbers, self.starts = np.empty(0, np.int64), np.empty(0, np.int64)

    def merged(self, numbers: np.ndarray, starts: np.ndarray) -> _Starts:
        """With a rank's sorted, distinct numbers and their first starts (a copy: the result may be live)."""
        out = _Starts()
        pos = np.searchsorted(self.numbers, numbers)
        if len(self.numbers) and np.array_equal(self.numbers[np.minimum(pos, len(self.numbers) - 1)], numbers):
            out.numbers, out.starts = self.numbers, self.starts.copy()  # the usual case: no new number, no sort
            np.minimum.at(out.starts, pos, starts)
            return out
        out.numbers = np.union1d(self.numbers, numbers)
        out.starts = np.full(len(out.numbers), np.iinfo(np.int64).max, np.int64)
        for nums, sts in ((self.numbers, self.starts), (numbers, starts)):
            np.minimum.at(out.starts, np.searchsorted(out.numbers, nums), sts)
        return out

    def of(self, numbers: np.ndarray) -> np.ndarray:
        return self.starts[np.searchsorted(self.numbers, numbers)]

    @property
    def nbytes(self) -> int:
        return int(self.numbers.nbytes + self.starts.nbytes)


def _compact(r: _Rank) -> tuple[_Steps, np.ndarray, np.ndarray]:
    """`r` reduced to `_Steps` (what `_basis` and `_outside` read of it, exactly), with its step numbers and
    their first starts (for `_Starts`)."""
    number, start, dur = r.step.view(), r.start.view(), r.dur.view()
    order = np.lexsort((start, number))
    number, start, dur = number[order], start[order], dur[order]
    first = np.r_[True, number[1:] != number[:-1]]
    number, start, dur = number[first], start[first], dur[first]
    runq = r.runq.view()[order][first] if r.runq.n == len(order) else None

    def per_step(steps: Appendable, times: Appendable) -> np.ndarray | None:
        covered = steps.n > 0 and len(np.intersect1d(number, steps.view())) >= COVERED * len(number)
        return _narrow(_per_step(number, steps.view(), times.view())) if covered else None

    steps = _Steps(_runs(number), _narrow(dur), per_step(r.coll_step, r.coll), per_step(r.bwd_step, r.bwd),
                   _narrow(runq) if runq is not None and runq.any() else None)
    return steps, number.astype(np.int64), start.astype(np.int64)


def _summary(r: _Rank, steps: _Steps) -> _Summary:
    """What the replay needs of a rank (kept as `steps`, tracked with spans)."""
    spans = sorted((r.spans or {}).items())
    rows = np.array([[k, a, b] for k, (a, b) in spans], np.int64).reshape(-1, 3)
    return _Summary(steps.runs, steps.coll is not None, steps.bwd is not None, rows)


def _kept_bytes(steps: _Steps) -> int:
    return sum(a.nbytes for a in (steps.runs, steps.dur, steps.coll, steps.bwd, steps.runq) if a is not None)


def _narrow(values: np.ndarray) -> np.ndarray:
    """int32 when every value fits (exact), else int64."""
    small = values.size == 0 or (int(values.min()) >= -(1 << 31) and int(values.max()) < 1 << 31)
    return values.astype(np.int32 if small else np.int64)


class Straggler(Rule):
    """For a job with several ranks, TRAIN steps only. Per rank and step, the time *outside* collective waits:
    the step minus its collectives where they are recorded per step (explicit torch.distributed calls), else
    the step minus its backward pass (DDP reduces gradients inside backward, so a fast rank's backward grows by
    its wait and the straggler's does not), and less the time the rank's training thread waited for a CPU (`runq_us`:
    a rank slowed by a busy or limited CPU is the machine's, CPUContention's finding; `own_outside`). Per step
    number shared by at least two ranks, each rank's excess
    over the median of the other ranks (of all ranks beyond 16); over every window of `window` consecutive shared
    steps, a rank whose mean excess is above `threshold` % of the median step and above `min_excess_ms` is a
    straggler. A node all of whose ranks are stragglers (with other nodes in the job) is named as the straggling
    node.

    Evaluation points: each window position of each rank. RuleTriggered = straggling ranks; Violations = window
    positions above the thresholds; Datapoints = rank-steps compared. Silent on a single rank."""

    name = "Straggler"
    metrics = ()  # framework events only
    description = ("Detects ranks that hold a distributed job back. In synchronous training every rank waits for the "
                   "slowest one inside the collectives, so all ranks show the same step time; the rule compares the "
                   "time each rank spends outside that waiting, step by step, and names the rank (and node) that is "
                   "consistently slower than the others.")
    recommendation = ("Find out why the straggling rank is slower: uneven data (longer samples or a slower data "
                      "path on that rank), extra work only that rank does (logging, evaluation, checkpointing on rank "
                      "0), a slower or throttled device, or other processes on its node.")
    defaults = {"threshold": 10, "min_excess_ms": 1, "window": 100}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window")
        check_non_negative(self, "threshold", "min_excess_ms")
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._done: dict[tuple[str, int], _Steps] = {}  # ranks of nodes whose data is complete, compacted
        self._starts = _Starts()  # their step numbers' earliest starts
        # … and, when the feed can read the run again (batch), their summaries: past KEEP_BYTES of kept steps,
        # only those are kept, and the result reads the run again
        self._summaries: dict[tuple[str, int], _Summary] = {}
        self._replay: Replay | None = None
        self._kept, self._replaying = 0, False
        self._events = 0

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        self._replay = chunk.replay
        self._add(chunk)
        for node in chunk.done:
            for key in [key for key in self._ranks if key[0] == node]:
                r = self._ranks.pop(key)
                if not r.has_steps:
                    continue
                if r.runs is not None:
                    self._summaries[key] = r.summary()
                    continue
                steps, numbers, starts = _compact(r)
                if r.spans is not None:
                    self._summaries[key] = _summary(r, steps)
                if self._replaying:
                    continue
                self._done[key], self._starts = steps, self._starts.merged(numbers, starts)
                self._kept += _kept_bytes(steps)
                if r.spans is not None and self._kept + self._starts.nbytes > KEEP_BYTES:
                    self._let_steps_go()

    def merge(self, other: Rule, node: str) -> None:
        """Take `node`'s finished ranks from `other`: their summaries always, their kept steps and starts unless
        either side has let steps go; kept steps past KEEP_BYTES together are let go, as `update` would."""
        assert isinstance(other, Straggler)
        self._events += other._events
        self._summaries.update(other._summaries)
        self._ranks.update(other._ranks)  # none: the feed says the node is complete
        if self._replaying or other._replaying:  # past a budget here, or with the node alone: so is the whole feed
            self._let_steps_go()  # (again: only the summaries are kept)
            return
        if not other._done:
            return
        self._done.update(other._done)
        self._starts = self._starts.merged(other._starts.numbers, other._starts.starts)
        self._kept += other._kept
        # `update` checks after each replayable rank; kept bytes and starts only grow, so once after the node is
        # the same (its ranks are replayable when their summaries are kept)
        if other._summaries and self._kept + self._starts.nbytes > KEEP_BYTES:
            self._let_steps_go()

    def __getstate__(self) -> dict[str, Any]:
        """Without the replay (a worker's reader of the run): the caller's rule gets its own from the final chunk."""
        return {**self.__dict__, "_replay": None}

    def _let_steps_go(self) -> None:
        """Past what is worth holding: the result reads the run again; of every rank from now on, only its summary."""
        self._replaying, self._done, self._starts = True, {}, _Starts()
        for r in self._ranks.values():
            if r.spans is not None and r.runs is None:
                r.keep_numbers_only()

    def _add(self, chunk: Chunk) -> None:
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        train = cols.mode_is([TRAIN]) & (cols.step >= 0)
        duration = np.maximum(cols.end - cols.start, 0)
        replayable = chunk.replay is not None
        for (node, rank), rows in cols.groups(cols.kind_is(STEP) & train, by_mode=False):
            r = self._rank((node, rank), replayable)
            if r.runs is not None:
                r.add_numbers(STEP, cols.step[rows])
            else:
                r.step.extend(cols.step[rows])
                r.start.extend(cols.start[rows])
                r.dur.extend(duration[rows])
                r.runq.extend(contention.step_runq(cols, rows))
            r.widen(cols.step[rows], cols.start[rows])
        for kind, attr in ((COLLECTIVE, "coll"), (BACKWARD, "bwd")):
            for (node, rank), rows in cols.groups(cols.kind_is(kind) & train, by_mode=False):
                r = self._rank((node, rank), replayable)
                if r.runs is not None:
                    r.add_numbers(kind, cols.step[rows])
                else:
                    getattr(r, f"{attr}_step").extend(cols.step[rows])
                    getattr(r, attr).extend(duration[rows])
                r.widen(cols.step[rows], cols.start[rows])
        if replayable and not self._replaying and sum(r.nbytes for r in self._ranks.values()) > NODE_BYTES:
            self._let_steps_go()  # a node too long to hold its steps while it is read: read it again instead

    def _rank(self, key: tuple[str, int], replayable: bool) -> _Rank:
        r = self._ranks.get(key)
        if r is None:
            r = self._ranks[key] = _Rank(replayable)
            if replayable and self._replaying:
                r.keep_numbers_only()
        return r

    def result(self) -> RuleResult:
        if self._events == 0:
            return self.not_applicable("no framework data: the job recorded no steps (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        compact, starts, summaries = dict(self._done), self._starts, dict(self._summaries)
        for key, r in self._ranks.items():  # ranks of nodes still being read (live evaluation)
            if not r.has_steps:
                continue
            if r.runs is not None:  # a batch feed that never said the node was complete
                summaries[key] = r.summary()
                continue
            compact[key], kept, kept_starts = _compact(r)
            starts = starts.merged(kept, kept_starts)
            if r.spans is not None:
                summaries[key] = _summary(r, compact[key])
        replaying = self._replaying and self._replay is not None
        ranks = sorted(summaries if replaying else compact)
        if len(ranks) < 2:
            return self.not_applicable("a single rank: there is no other rank to be slower than")
        grid: _Grid | _Replayed
        if replaying:
            assert self._replay is not None
            basis = _basis([(summaries[k].coll, summaries[k].bwd) for k in ranks])
            grid = _Replayed([(k, summaries[k]) for k in ranks], basis, self._replay)
        else:
            basis = _basis([(compact[k].coll is not None, compact[k].bwd is not None) for k in ranks])
            grid = _Grid([compact[k] for k in ranks], basis, starts)
        if len(grid.numbers) < MIN_SHARED_STEPS:
            return self.not_applicable(f"fewer than {MIN_SHARED_STEPS} TRAIN steps shared by two ranks or more")
        threshold, floor_us = float(self.params["threshold"]), float(self.params["min_excess_ms"]) * 1000.0
        window = min(self.params["window"], len(grid.numbers))
        scan = _Scan(len(ranks), window, threshold, floor_us)
        medians = []
        for a, median_step, excess in grid.blocks(block_columns(len(ranks))):
            scan.add(a, median_step, excess)
            medians.append(median_step)
        median_all = float(np.nanmedian(np.concatenate(medians)))
        del medians
        numbers, firsts = grid.numbers, grid.starts
        table: dict[str, Any] = {}
        stragglers: list[dict[str, Any]] = []
        triggered = violations = 0
        for i, (node, rank) in enumerate(ranks):
            have = int(scan.count[i])
            mean_excess = float(scan.total[i]) / have if have else 0.0
            above = int(scan.above[i])
            entry = {"node": node, "rank": rank, "steps": have, "basis": basis,
                     "mean_excess_s": mean_excess / US,
                     "mean_share": 100.0 * mean_excess / median_all,
                     "windows_above": above, "triggered": above > 0}
            if above:
                first, worst = int(scan.first[i]), int(scan.worst[i])
                entry.update(first_window={"first_step": int(numbers[first]), "start_us": int(firsts[first])},
                             worst_window={"first_step": int(numbers[worst]),
                                           "last_step": int(numbers[min(worst + window - 1, len(numbers) - 1)]),
                                           "excess_s_per_step": float(scan.worst_excess[i]) / US,
                                           "share": float(scan.worst_share[i])})
                triggered += 1
                violations += above
                stragglers.append({"node": node, "rank": rank, "excess_s_per_step": mean_excess / US,
                                   "share": entry["mean_share"], "steps": entry["steps"],
                                   "since_step": int(numbers[first]), "since_us": int(firsts[first])})
            table[f"{node}/{rank}"] = entry
        fired = np.array([table[f"{n}/{r}"]["triggered"] for n, r in ranks])
        # the job waits for the slowest straggler at every step: its excess, step by step (half-µs values: the
        # sum is exact in any order, so block by block)
        stake = 0.0
        if fired.sum() == 1:  # the one straggler's positive excess, summed by the scan: no second pass
            stake = float(scan.positive[int(np.argmax(fired))]) / US
        elif fired.any() and isinstance(grid, _Replayed):
            stake = grid.stake([(k, summaries[k]) for k, f in zip(ranks, fired) if f], basis,
                               block_columns(len(ranks))) / US
        elif fired.any():
            for _, _, excess in grid.blocks(block_columns(len(ranks))):
                stake += _stake(excess, fired)
            stake /= US
        nodes = _straggling_nodes(ranks, fired)
        details: dict[str, Any] = {"stragglers": stragglers, "ranks": table, "straggling_nodes": nodes,
                                   "time_at_stake_s": stake, "shared_steps": int(len(numbers)),
                                   "median_step_s": median_all / US}
        if stragglers:
            names = [f"{s['node']}/{s['rank']}" for s in stragglers]
            details["ranks_fired"] = names
            details["nodes"] = nodes or sorted({s["node"] for s in stragglers})
            top = max(stragglers, key=lambda s: s["excess_s_per_step"])
            details["title"] = (f"Rank {names[0]} is a straggler: +{1000 * top['excess_s_per_step']:.0f} ms per step "
                                f"({top['share']:.0f} % of a step) that every other rank waits for"
                                if len(names) == 1 else f"{len(names)} straggling ranks ({', '.join(names[:4])}"
                                f"{'…' if len(names) > 4 else ''}) hold the others back")
        return self.make_result(triggered=triggered, violations=violations,
                                datapoints=int(scan.count.sum()), details=details,
                                recommendation=self._advice(stragglers, nodes, stake) if stragglers else None)

    def _advice(self, stragglers: list[dict[str, Any]], nodes: list[str], stake: float) -> str:
        who = "; ".join(f"rank {s['node']}/{s['rank']} spends {1000 * s['excess_s_per_step']:.1f} ms per step "
                        f"({s['share']:.0f} %) more outside the collectives than the median rank, since step "
                        f"{s['since_step']}" for s in stragglers[:8])
        where = f" All ranks of node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)} are slow: look at the node " \
                "(hardware, thermal throttling, other processes, its data path)." if nodes else ""
        return f"{who}. The other ranks wait for it, about {stake:.1f} s in all.{where} {self.recommendation}"


BLOCK_CELLS = 1 << 17  # ranks × step numbers compared at once (1 MB per float64 matrix, a dozen of them at
# once): what the result holds beyond the ranks' steps


def block_columns(ranks: int) -> int:
    """Step numbers per block so that a block's ranks × numbers matrices stay within `BLOCK_CELLS` cells."""
    return max(1, BLOCK_CELLS // max(ranks, 1))


class _Grid:
    """The step numbers shared by two ranks or more (sorted), their earliest start and the median step of the
    ranks at each; `blocks()` hands out the ranks × numbers matrices a block of numbers at a time, so the result
    never holds the whole ranks × steps matrix."""

    def __init__(self, ranks: list[_Steps], basis: str, starts: _Starts) -> None:
        """`starts`: every one of `ranks`' step numbers (and its first start), as merged when they were kept."""
        self.ranks, self.basis = ranks, basis
        everything = starts.numbers
        seen = np.zeros(len(everything), np.int64)
        for r in ranks:
            seen[np.searchsorted(everything, r.numbers())] += 1  # numbers are distinct within a rank
        self.numbers = everything[seen >= 2]
        self.starts = starts.of(self.numbers)

    def blocks(self, width: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(first column, median step, excess) per block of `width` shared numbers."""
        for a in range(0, len(self.numbers), width):
            numbers = self.numbers[a:a + width]
            matrix = np.full((len(self.ranks), len(numbers)), np.nan)  # time outside waits, µs
            steps = np.full((len(self.ranks), len(numbers)), np.nan)  # step duration, µs
            for i, r in enumerate(self.ranks):
                lo, hi = r.locate(np.array([numbers[0], numbers[-1] + 1])) if len(numbers) else (0, 0)
                num, out, dur = _outside(r, self.basis, lo, hi)
                pos = np.searchsorted(numbers, num)
                ok = (pos < len(numbers)) & (numbers[np.minimum(pos, len(numbers) - 1)] == num)
                matrix[i, pos[ok]], steps[i, pos[ok]] = out[ok], dur[ok]
            with np.errstate(all="ignore"):
                median = column_medians(steps)
            yield a, median, _excess(matrix)


class _Scan:
    """Per rank, over windows of `window` consecutive shared numbers fed a block at a time: the sum and count of
    its excess, the windows above the thresholds, the first one and the worst one (first of equals). Excess and
    step medians are half-µs values, so every sum is exact whatever the blocks: the results equal one block."""

    def __init__(self, ranks: int, window: int, threshold: float, floor_us: float) -> None:
        self.window, self.threshold, self.floor_us = window, threshold, floor_us
        self.total, self.count = np.zeros(ranks), np.zeros(ranks, np.int64)
        self.positive = np.zeros(ranks)  # the sum of each rank's excess above 0 (the time at stake of one straggler)
        self.above, self.first, self.worst = (np.zeros(ranks, np.int64), np.full(ranks, -1, np.int64),
                                              np.full(ranks, -1, np.int64))
        self.worst_share, self.worst_excess = np.full(ranks, -np.inf), np.zeros(ranks)
        # the last window - 1 columns seen: values (0 where missing), presence, median step
        self._tail = (np.zeros((ranks, 0)), np.zeros((ranks, 0), bool), np.zeros(0))

    def add(self, a: int, median_step: np.ndarray, excess: np.ndarray) -> None:
        have = ~np.isnan(excess)
        values = np.where(have, excess, 0.0)
        self.total += values.sum(axis=1)
        self.positive += np.maximum(values, 0).sum(axis=1)
        self.count += have.sum(axis=1)
        tv, th, tm = self._tail
        v, h = np.concatenate([tv, values], axis=1), np.concatenate([th, have], axis=1)
        m = np.concatenate([tm, median_step])
        offset = a - tv.shape[1]  # the global column of v's first column
        w = self.window
        if v.shape[1] >= w:
            cv = np.concatenate([np.zeros((len(v), 1)), np.cumsum(v, axis=1)], axis=1)
            ch = np.concatenate([np.zeros((len(h), 1), np.int64), np.cumsum(h, axis=1)], axis=1)
            total, count = cv[:, w:] - cv[:, :-w], ch[:, w:] - ch[:, :-w]
            with np.errstate(invalid="ignore", divide="ignore"):
                win_excess = np.where(count > 0, total / np.maximum(count, 1), 0.0)
                for i in range(len(v)):
                    hm = np.where(h[i], m, 0.0)
                    cm = np.r_[0.0, np.cumsum(hm)]
                    win_step = np.where(count[i] > 0, (cm[w:] - cm[:-w]) / np.maximum(count[i], 1), 0.0)
                    share = np.where(win_step > 0, 100.0 * win_excess[i] / win_step, 0.0)
                    over = (share > self.threshold) & (win_excess[i] > self.floor_us)
                    if not over.any():
                        continue
                    self.above[i] += int(np.count_nonzero(over))
                    if self.first[i] < 0:
                        self.first[i] = offset + int(np.argmax(over))
                    best = int(np.argmax(np.where(over, share, -np.inf)))
                    if share[best] > self.worst_share[i]:
                        self.worst[i], self.worst_share[i] = offset + best, float(share[best])
                        self.worst_excess[i] = float(win_excess[i][best])
        keep = min(w - 1, v.shape[1])
        self._tail = (v[:, v.shape[1] - keep:], h[:, h.shape[1] - keep:], m[len(m) - keep:])


def _basis(covered: list[tuple[bool, bool]]) -> str:
    """What every rank's waiting is taken to be, from whether each rank's (collectives, backward) cover most of
    its steps: its collectives where every rank's do (explicit calls), else its backward pass where every rank
    records one (DDP reduces inside it), else nothing (the whole step is compared)."""
    if all(coll for coll, _ in covered):
        return "collectives"
    if all(bwd for _, bwd in covered):
        return "backward"
    return "nothing"


def _outside(r: _Steps, basis: str, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows [lo, hi) of a rank, one per step number: (numbers, time outside waits, step duration), both its own
    (less its wait for a CPU: `own_outside`)."""
    rows = slice(lo, hi)
    dur = r.dur[rows].astype(np.int64)
    numbers = r.numbers(int(lo), int(hi) if hi is not None else None)
    subtract = {"collectives": r.coll, "backward": r.bwd}.get(basis)
    if subtract is not None:
        dur_out = np.maximum(dur - subtract[rows].astype(np.int64), 0)
    else:
        dur_out = np.maximum(dur, 0)
    runq = r.runq[rows] if r.runq is not None else None
    out, own = own_outside(dur.astype(np.float64), dur_out.astype(np.float64), runq, basis)
    return numbers, out, own


def _per_step(number: np.ndarray, steps: np.ndarray, times: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(number, steps)
    ok = (pos < len(number)) & (number[np.minimum(pos, len(number) - 1)] == steps)
    out = np.zeros(len(number), np.int64)
    np.add.at(out, pos[ok], times[ok])
    return out


def _straggling_nodes(ranks: list[tuple[str, int]], fired: np.ndarray) -> list[str]:
    """Nodes all of whose ranks straggle, when the job has other nodes too."""
    nodes = sorted({n for n, _ in ranks})
    if len(nodes) < 2:
        return []
    return [n for n in nodes if all(fired[i] for i, (m, _) in enumerate(ranks) if m == n)]


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """The stragglers, from when each fell behind to the loop's end; the stored entries as the evidence."""
    d = StragglerDetails.from_json(r.details)
    stored = [x for x in r.details.get("stragglers") or [] if isinstance(x, dict)]  # this rule's own Details
    if not r.fired or not d.stragglers:
        return []
    nodes = d.straggling_nodes or sorted({x.node for x in d.stragglers})
    since = [(x.since_us, int(s.loop.last_us)) for x in d.stragglers if x.since_us is not None and s.loop is not None]
    return [finding(r, s, "ranks", d.title or "A rank holds the others back", over_all_steps(d.time_at_stake_s, s),
                    Where(nodes, [x.key for x in d.stragglers], [], since[:LISTED_WINDOWS]),
                    {"stragglers": stored[:16], "median_step_s": d.median_step_s})]
