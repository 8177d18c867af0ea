"""MaxInitializationTime (RULES.md): the time from a node's start to its first step.

It keeps what it needs of every step and decides in `result()` from everything seen so far, with exact integer
sums and a canonical order (per group, by step number then start), so the answer depends on the data only: one chunk
or many gives the same result."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from stallwatch.analyze.finding import HIGH, HIGH_SHARE, LOW, MEDIUM, MEDIUM_SHARE, Finding, Where, finding
from stallwatch.analyze.framework_frame import new_events
from stallwatch.analyze.rules.base import Chunk, ParameterError, Rule, RuleResult
from stallwatch.analyze.rules.kit.details import DetailsRecord
from stallwatch.analyze.rules.step_series import US
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import STEP
from stallwatch.timeutil import format_duration


@dataclass(frozen=True)
class NodeStart(DetailsRecord):
    """One node, Details["nodes"][node]: when it started and when its first step did (µs since the epoch), and the
    time between (s)."""

    start_us: int | None = None
    first_step: int | None = None
    initialization_s: float | None = None


@dataclass(frozen=True)
class MaxInitializationTimeDetails(DetailsRecord):
    """MaxInitializationTime's Details (SageMaker's keys): the job's start and end and its first and last step's
    start (µs since the epoch), their step numbers, the initialization (start → first step), training loop and
    finalization (s), how long it waited without a step (s, while none came), the threshold (s), and per node."""

    rule = "MaxInitializationTime"
    job_start: int | None = None
    job_end: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    step_num: dict[str, int] = field(default_factory=dict)
    initialization_s: float | None = None
    training_loop_s: float | None = None
    finalization_s: float | None = None
    waited_s: float | None = None
    threshold_s: float | None = None
    nodes: dict[str, NodeStart] = field(default_factory=dict)

    @property
    def job_s(self) -> float:
        """The job's duration (s), 0 when unknown."""
        start, end = self.job_start, self.job_end
        return (end - start) / 1e6 if start is not None and end is not None and end > start else 0.0


class MaxInitializationTime(Rule):
    """Fires when the first step (of any phase) starts more than `threshold` minutes after the job started.

    Evaluation point: one, the deadline job start + `threshold`. It holds when no step started by then and
    the data shows the deadline has passed: a step that started later, or any snapshot or event later than
    it ("now" is the latest timestamp in the data, never the wall clock, so live and batch agree). In live
    mode it therefore fires as soon as data past the deadline arrives without a step before it.

    Job start: the run's `start_us` (earliest node start), else the earliest datum. Without any framework
    event the run may simply not be instrumented: the rule still fires while the run is live (a job stuck
    in initialization sends nothing), but a finished run without framework data is not applicable."""

    name = "MaxInitializationTime"
    metrics = ()  # of snapshots, only their timestamps
    description = ("Checks how long the job took to reach its first training step. The rule waits until the first "
                   "step of the training loop starts and triggers when that took longer than the threshold. "
                   "Initialization can take long when the whole data set is downloaded or preprocessed before "
                   "training, or when distributed workers wait for each other to join. The default threshold is "
                   "20 minutes.")
    recommendation = ("Initialization takes too long. Stream or shard the data set instead of copying it whole before "
                      "training (an IterableDataset reading from object storage, for example), cache preprocessed "
                      "data between runs, and check how long distributed workers take to join.")
    defaults = {"threshold": 20}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        value = self.params["threshold"]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ParameterError(f"{self.name}.threshold={value!r}: must be a number of minutes >= 0")
        self._run: dict[str, Any] = {}
        self._final = False
        self._events = 0
        self._steps = 0
        self._first_step: int | None = None
        self._last_step_end: int | None = None
        self._node_first: dict[str, int] = {}
        self._data_min: int | None = None
        self._data_max: int | None = None

    def _seen(self, lo: int, hi: int) -> None:
        self._data_min = lo if self._data_min is None else min(self._data_min, lo)
        self._data_max = hi if self._data_max is None else max(self._data_max, hi)

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        self._run = chunk.run or self._run
        self._final = self._final or chunk.final
        for frame in chunk.system.values():
            if len(frame):
                self._seen(int(frame.timestamps.min()), int(frame.timestamps.max()))
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        self._seen(int(cols.start.min()), int(max(cols.end.max(), cols.start.max())))
        is_step = cols.kind_is(STEP)
        if not is_step.any():
            return
        self._steps += int(is_step.sum())
        first, last = int(cols.start[is_step].min()), int(cols.end[is_step].max())
        self._first_step = first if self._first_step is None else min(self._first_step, first)
        self._last_step_end = last if self._last_step_end is None else max(self._last_step_end, last)
        for (node, _), rows in cols.groups(is_step, by_mode=False):
            t = int(cols.start[rows].min())
            self._node_first[node] = min(self._node_first.get(node, t), t)

    def merge(self, other: Rule, node: str) -> None:
        assert isinstance(other, MaxInitializationTime)
        self._run = other._run or self._run
        self._final = self._final or other._final
        self._events += other._events
        self._steps += other._steps
        self._first_step = _least(self._first_step, other._first_step)
        self._last_step_end = _most(self._last_step_end, other._last_step_end)
        self._node_first.update(other._node_first)
        self._data_min = _least(self._data_min, other._data_min)
        self._data_max = _most(self._data_max, other._data_max)

    def result(self) -> RuleResult:
        run = self._run
        job_start = run.get("start_us")
        if job_start is None:
            starts = [n.get("start_us") for n in (run.get("nodes") or {}).values() if n.get("start_us") is not None]
            job_start = min(starts) if starts else self._data_min
        if job_start is None:
            return self.not_applicable("no data: neither the job's start nor any snapshot or event is known")
        job_start = int(job_start)
        run_end = run.get("end_us")
        now = self._data_max if self._data_max is not None else job_start
        if self._final and run_end is not None:
            now = max(now, int(run_end))
        job_end = int(run_end) if run_end is not None else now
        limit_us = float(self.params["threshold"]) * 60 * US
        first, last = self._first_step, self._last_step_end
        details: dict[str, Any] = {
            "job_start": job_start, "job_end": job_end, "first_step": first, "last_step": last,
            "step_num": {"first": first, "last": last} if first is not None else {},
            "initialization_s": (first - job_start) / US if first is not None else None,
            "training_loop_s": (last - first) / US if first is not None else None,
            "finalization_s": max(job_end - last, 0) / US if last is not None else None,
            "waited_s": ((min(first, now) if first is not None else now) - job_start) / US,
            "threshold_s": limit_us / US,
            "nodes": _node_starts(run, self._node_first),
        }
        if self._events == 0 and self._final:
            return self.not_applicable("no framework data: no step was recorded, so the initialization time is "
                                       "unknown (the job never reached its training loop, or PyTorch was not "
                                       "profiled)", details)
        if first is not None:
            fires = first - job_start > limit_us
        else:
            fires = now - job_start > limit_us
        message = ""
        if fires and first is None:
            message = (f"no step after {(now - job_start) / 60 / US:.1f} minutes (threshold "
                       f"{self.params['threshold']} minutes)")
            if self._events == 0:
                message += "; no framework event has arrived yet"
        recommendation = None
        if fires:
            waited = (first if first is not None else now) - job_start
            what = "started" if first is not None else "has not started after"
            recommendation = (f"The first training step {what} {format_duration(waited / US)} after the job "
                              f"started (threshold {self.params['threshold']} minutes). " + self.recommendation)
        return self.make_result(triggered=int(fires), violations=int(fires), datapoints=self._steps,
                                details=details, message=message, recommendation=recommendation)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _node_starts(run: dict[str, Any], first_steps: dict[str, int]) -> dict[str, dict[str, Any]]:
    nodes = run.get("nodes") or {}
    out = {}
    for node in sorted(set(nodes) | set(first_steps)):
        start = (nodes.get(node) or {}).get("start_us")
        first = first_steps.get(node)
        out[node] = {"start_us": start, "first_step": first,
                     "initialization_s": (first - start) / US if first is not None and start is not None else None}
    return out


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """The time to the first step, measured against the whole job (initialization is outside the loop)."""
    if not r.fired:
        return []
    d = MaxInitializationTimeDetails.from_json(r.details)
    init, waited = d.initialization_s, d.waited_s
    stake = float(init) if init is not None else float(waited) if waited is not None else None
    title = (f"Initialization took {format_duration(stake)} before the first step" if stake is not None
             else "The job took too long to reach its first step")
    start, first = d.job_start, d.first_step
    windows = [(start, first)] if start is not None and first is not None else []
    share_base = s.duration_s
    f = finding(r, s, "start", title, stake, Where(list(s.nodes), windows=windows),
                {"initialization_s": init, "threshold_minutes": r.parameters.get("threshold")})
    share = stake / share_base if stake is not None and share_base > 0 else None
    severity = LOW if share is None else HIGH if share >= HIGH_SHARE else MEDIUM if share >= MEDIUM_SHARE else LOW
    return [Finding(f.id, f.rule, severity, f.title, f.time_at_stake_s, share, f.where, f.evidence,
                    f.recommendation, share_of="job")]
