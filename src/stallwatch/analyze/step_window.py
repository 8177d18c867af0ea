"""Framework events of a time range, as the dashboard lists and draws them: the events themselves when they are
few (phases, steps, forward / backward / optimizer, data wait on one time axis), always the totals per kind
(what brushing an interval lists), and the last steps of a rank split into their phases (time per event over
the last 30 steps)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze.steps import PHASES
from stallwatch.records import BACKWARD, COLLECTIVE, STEP

# Collectives too: a distributed job's step is read with its communication (DDP's exposed all-reduce, timed
# inside backward, is taken out of backward's time where a step is split).
BREAKDOWN_KINDS = (*PHASES, COLLECTIVE)
EVENT_KINDS = (STEP, *BREAKDOWN_KINDS)


@dataclass(frozen=True)
class Event:
    kind: str
    name: str
    rank: int
    mode: str
    step: int | None
    start_us: int
    end_us: int


@dataclass(frozen=True)
class KindTotal:
    kind: str
    count: int
    total_s: float  # time inside the range (events clipped to it), all ranks together


@dataclass(frozen=True)
class EventBucket:
    """The steps that started in one time bucket, all ranks together: how many, their mean time, and each
    phase's time per step (ms): what the timeline draws when the events are too many to draw one by one."""
    start_us: int
    width_us: int
    steps: int
    step_ms: float
    phases_ms: dict[str, float]


@dataclass(frozen=True)
class EventsWindow:
    start_us: int | None
    end_us: int | None
    totals: list[KindTotal]
    steps: int  # step events overlapping the range
    events: list[Event]  # empty when more than the limit overlap the range (`truncated`)
    truncated: bool
    total_events: int
    buckets: list[EventBucket] = field(default_factory=list)  # when `truncated`: the range in time buckets


BUCKETS = 200  # buckets across a range whose events are too many to draw


def buckets_of(starts: np.ndarray, kinds: np.ndarray, sums_us: np.ndarray, counts: np.ndarray,
               width_us: int) -> list[EventBucket]:
    """Per bucket (`starts`, one row per bucket and kind: events `counts`, durations `sums_us`), the steps, the
    mean step and each phase per step; buckets without a step are left out (nothing to divide by)."""
    buckets, at = np.unique(starts, return_inverse=True)
    nb = len(buckets)
    is_step = kinds == STEP
    steps = np.bincount(at, weights=np.where(is_step, counts, 0), minlength=nb)
    step_us = np.bincount(at, weights=np.where(is_step, sums_us, 0), minlength=nb)
    phase_us, has_phase = {}, {}
    for k in PHASES:
        mine = kinds == k
        if mine.any():
            phase_us[k] = np.bincount(at, weights=np.where(mine, sums_us, 0), minlength=nb)
            has_phase[k] = np.bincount(at, weights=mine, minlength=nb) > 0
    out = []
    for i in np.flatnonzero(steps > 0):
        n = int(steps[i])
        phases = {k: float(phase_us[k][i]) / n / 1000 for k in PHASES if k in has_phase and has_phase[k][i]}
        out.append(EventBucket(int(buckets[i]), width_us, n, float(step_us[i]) / n / 1000, phases))
    return out


def event_buckets(kinds: np.ndarray, start: np.ndarray, end: np.ndarray, lo: int, hi: int,
                  n: int = BUCKETS) -> list[EventBucket]:
    """Events (by their start) in `n` equal buckets of [lo, hi)."""
    width = max(1, -(-(hi - lo) // n))
    bucket = lo + (start - lo) // width * width
    return buckets_of(bucket, kinds, (end - start).astype(np.int64), np.ones(len(start), np.int64), int(width))


@dataclass(frozen=True)
class StepBreakdown:
    """One step of one rank: its duration and the time of each phase inside it (ms); `other` is the rest."""
    node: str
    rank: int
    step: int | None
    mode: str
    start_us: int
    end_us: int
    duration_ms: float
    phases_ms: dict[str, float] = field(default_factory=dict)
    other_ms: float = 0.0


def events_window(events: pa.Table, start_us: int | None, end_us: int | None, limit: int = 4000) -> EventsWindow:
    """The events of `events` (framework_schema rows) overlapping [start_us, end_us)."""
    n = events.num_rows
    if n == 0:
        return EventsWindow(start_us, end_us, [], 0, [], False, 0)
    kinds = events["kind"].cast(pa.string()).to_numpy(zero_copy_only=False)
    start = events["start_us"].to_numpy()
    end = events["end_us"].to_numpy()
    lo = start if start_us is None else np.maximum(start, start_us)
    hi = end if end_us is None else np.minimum(end, end_us)
    inside = np.maximum(hi - lo, 0)
    totals = []
    for kind in EVENT_KINDS:
        mask = kinds == kind
        if mask.any():
            totals.append(KindTotal(kind, int(mask.sum()), float(inside[mask].sum()) / 1e6))
    steps = int((kinds == STEP).sum())
    if n > limit:
        first = int(start.min()) if start_us is None else start_us
        last = int(end.max()) if end_us is None else end_us
        return EventsWindow(start_us, end_us, totals, steps, [], True, n,
                            event_buckets(kinds, start, end, first, max(last, first + 1)))
    rows = events.select(["kind", "name", "rank", "mode", "step", "start_us", "end_us"]).to_pylist()
    out = [Event(str(e["kind"]), str(e["name"]), int(e["rank"]), str(e["mode"]), e["step"], int(e["start_us"]),
                 int(e["end_us"])) for e in rows]
    out.sort(key=lambda e: (e.start_us, e.rank))
    return EventsWindow(start_us, end_us, totals, steps, out, False, n)


def step_breakdown(events: pa.Table, last: int = 30) -> list[StepBreakdown]:
    """The last `last` steps of the first rank that has steps in `events` (all modes), each with its phases'
    time; phases are matched to the step they fall in on the same rank."""
    if events.num_rows == 0:
        return []
    kinds = events["kind"].cast(pa.string())
    steps = events.filter(pc.equal(kinds, STEP))
    if steps.num_rows == 0:
        return []
    node = str(steps["node"][0].as_py())
    rank = int(steps["rank"][0].as_py())
    mine = events.filter(pc.and_(pc.equal(events["node"].cast(pa.string()), node), pc.equal(events["rank"], rank)))
    mine_kinds = mine["kind"].cast(pa.string()).to_numpy(zero_copy_only=False)
    s_rows = np.flatnonzero(mine_kinds == STEP)
    start, end = mine["start_us"].to_numpy(), mine["end_us"].to_numpy()
    order = s_rows[np.argsort(start[s_rows], kind="stable")][-last:]
    out = []
    modes = mine["mode"].cast(pa.string()).to_numpy(zero_copy_only=False)
    step_no = mine["step"].to_pylist()
    for i in order:
        s, e = int(start[i]), int(end[i])
        inside = (start >= s) & (end <= e) & (mine_kinds != STEP)
        phases = {k: float((end[inside & (mine_kinds == k)] - start[inside & (mine_kinds == k)]).sum()) / 1e3
                  for k in BREAKDOWN_KINDS}
        phases[BACKWARD] = max(phases[BACKWARD] - _nested_ms(start, end, inside & (mine_kinds == COLLECTIVE),
                                                             inside & (mine_kinds == BACKWARD)), 0.0)
        dur = (e - s) / 1e3
        out.append(StepBreakdown(node, rank, step_no[i], str(modes[i]), s, e, dur,
                                 {k: v for k, v in phases.items() if v > 0},
                                 max(dur - sum(phases.values()), 0.0)))
    return out


def _nested_ms(start: np.ndarray, end: np.ndarray, inner: np.ndarray, outer: np.ndarray) -> float:
    """The time (ms) of the `inner` events that lie inside one of the `outer` events: counted once, in the
    inner kind (a collective inside backward is communication, not backward's compute)."""
    outs = np.flatnonzero(outer)
    total = 0
    for i in np.flatnonzero(inner):
        if ((start[outs] <= start[i]) & (end[i] <= end[outs])).any():
            total += int(end[i] - start[i])
    return total / 1e3
