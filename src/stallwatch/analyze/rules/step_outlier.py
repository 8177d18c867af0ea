"""StepOutlier (RULES.md): steps longer than mean + stddev · std of their rank and phase, with what they spent
their extra time on.

It keeps what it needs of every step and decides in `result()` from everything seen so far, with exact integer
sums and a canonical order (per group, by step number then start), so the answer depends on the data only: one chunk
or many gives the same result."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from stallwatch.analyze.contention import own_time, peer_runq, step_runq
from stallwatch.analyze.finding import LISTED_STEPS, LISTED_WINDOWS, Finding, Where, finding
from stallwatch.analyze.framework_frame import FrameworkColumns, mode_order, new_events, rank_key
from stallwatch.analyze.rules.base import Chunk, ParameterError, Replay, Rule, RuleResult
from stallwatch.analyze.rules.kit.checks import check_non_negative
from stallwatch.analyze.rules.kit.details import DetailsRecord, json_key
from stallwatch.analyze.rules.step_series import (
    _CONTEXT_NAMES,
    _OTHER,
    CONTEXT_KINDS,
    US,
    SeriesFacts,
    _Series,
    series_facts,
)
from stallwatch.analyze.rules.step_spans import track_spans
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import MODES, STEP
from stallwatch.timeutil import format_duration


@dataclass(frozen=True)
class StepStats(DetailsRecord):
    """A series' step durations in seconds."""

    mean: float | None = None
    max: float | None = None
    p99: float | None = None
    p95: float | None = None
    p50: float | None = None
    min: float | None = None


@dataclass(frozen=True)
class StepContext(DetailsRecord):
    """Mean seconds per step in each part of the step (data_wait, forward, backward, optimizer, collective, other,
    outside_phases), of the outlier steps and of the normal ones."""

    outlier_steps: dict[str, float] = field(default_factory=dict)
    normal_steps: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StepSeries(DetailsRecord):
    """One rank and phase, Details["step_details"]["node/rank/PHASE"]: its steps' statistics (s), outliers (steps
    above `outlier_threshold` s = mean + stddev · std; `outliers_waiting_for_cpu` more were above it only by the
    time the training thread's native peers waited for a CPU, and are not counted), their excess over the median (s, % of the series' time),
    the histogram of its normal steps (`probs` over `binedges`, s), and the slowest outliers listed: their step
    numbers, durations (s) and starts (µs since the epoch)."""

    node: str = ""
    rank: int | None = None
    phase: str = ""
    steps: int = 0
    step_stats: StepStats = field(default_factory=StepStats)
    number_of_outliers: int = 0
    outliers_waiting_for_cpu: int = 0
    excess_s: float | None = None
    excess_pct: float | None = None
    stddev: float | None = None
    outlier_threshold: float | None = None
    triggered: bool = False
    probs: list[float] = field(default_factory=list)
    binedges: list[float] = field(default_factory=list)
    step_numbers: list[int] = field(default_factory=list)
    outliers: list[float] = field(default_factory=list)
    outlier_start_us: list[int] = field(default_factory=list)
    outliers_listed: int = 0
    framework_context: StepContext = field(default_factory=StepContext)

    @property
    def rank_key(self) -> str:
        return f"{self.node}/{self.rank}"

    def listed(self) -> list[tuple[float, int, int]]:
        """The listed outliers as (duration s, step number, start µs)."""
        return list(zip(self.outliers, self.step_numbers, self.outlier_start_us))


@dataclass(frozen=True)
class StepOutlierDetails(DetailsRecord):
    """StepOutlier's Details: every rank and phase series, and over the outlier steps of the series that fired, the
    share (%) of their time per phase and per part of the step."""

    rule = "StepOutlier"
    series: dict[str, StepSeries] = json_key("step_details", {})
    phase: dict[str, float] = field(default_factory=dict)
    forward_backward: dict[str, float] = field(default_factory=dict)

    def outliers(self) -> int:
        return sum(s.number_of_outliers for s in self.series.values())


class StepOutlier(Rule):
    """Per rank and phase (mode), a step is an outlier when its duration exceeds mean + `stddev` × standard
    deviation (population std, ddof=0) of that rank's steps of that phase; a (rank, phase) *fires* when it
    has more than `n_outliers` outliers *and* their excess time (each outlier's duration minus the series'
    median, summed) is at least `min_excess_pct` % of the series' time: thousands of jitter outliers among
    millions of sub-millisecond steps are not a finding, 15 stalls of 0.25 s in a 7 s loop are. Steps are judged
    on their own time (less the training thread's wait for a CPU), and a step over the threshold only by the time
    its native peers (the intra-op pool) waited for a CPU is not an outlier: on a busy machine the training
    thread spins at a barrier for a preempted peer (`outliers_waiting_for_cpu`; CPUContention names that time).

    Evaluation points: one per (node, rank, phase) series, evaluated on every step of it seen so far (mean
    and std need all of them, so there is no per-step verdict that later steps would not change). The
    result at any time is the verdict on the data so far; on a finished run it is the batch verdict, however
    the data was chunked. RuleTriggered = series that fire; Violations = outlier steps of firing series;
    Datapoints = steps evaluated.

    Mean and std come from exact integer sums of the µs durations; the comparison is made in µs. The
    context of a step (time per phase kind) is kept for a span of 4 M step numbers per series.

    `mode` restricts to one phase (TRAIN, EVAL or GLOBAL, any case); None evaluates each phase on its own.
    `threshold` is SageMaker's report name for the same multiplier: it is kept (RuleParameters) for old
    tooling but the multiplier used is `stddev`."""

    name = "StepOutlier"
    metrics = ()  # framework events only
    description = ("Detects outliers in step duration. The step duration for forward and backward pass should be "
                   "roughly the same throughout the training. If there are significant outliers, "
                   "it may indicate a system stall or bottleneck issues.")
    recommendation = "Check if there are any bottlenecks (CPU, I/O) correlated to the step outliers."
    defaults = {"threshold": 3, "mode": None, "n_outliers": 10, "stddev": 3, "min_excess_pct": 5.0}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        mode = self.params["mode"]
        if mode is not None:
            text = str(mode).strip().upper().rsplit(".", 1)[-1]  # "train", "ModeKeys.TRAIN" -> TRAIN
            if text not in MODES:
                raise ParameterError(f"{self.name}.mode={mode!r}: must be one of {', '.join(MODES)} or None")
            self.params["mode"] = text
        check_non_negative(self, "n_outliers", "stddev", "threshold", "min_excess_pct")
        self._modes = (self.params["mode"],) if self.params["mode"] else MODES
        self._series: dict[tuple[str, int, str], _Series] = {}
        self._judged: dict[tuple[str, int, str], _Judged] = {}  # series of nodes whose data is complete
        self._events = 0
        # Batch feeds (`Chunk.replay`): a node whose steps pass step_stream.NODE_BYTES is streamed (its series
        # reduced to sums and counts) and read again once complete; per node and phase, where each span of step
        # numbers lies in time, tracked from its first chunk.
        self._replay: Replay | None = None
        self._streamed: dict[tuple[str, int, str], Any] = {}  # step_stream.StreamedSeries, by series
        self._spans: dict[str, dict[str, dict[int, list[int]]]] = {}  # node -> phase -> span -> [first, last start]
        self._rates: dict[str, list[int]] = {}  # node -> [events, first start, last start]: how long a piece to read

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        self._replay = chunk.replay or self._replay
        self._add(chunk)
        for node in chunk.done:
            self._close(node)

    def _add(self, chunk: Chunk) -> None:
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        if chunk.replay is not None:
            track_spans(cols, cols.mode_is(self._modes) & (cols.step >= 0), self._spans, self._rates)

        def series_of(key: tuple[str, int, str]) -> Any:
            s = self._streamed.get(key)
            if s is None:
                s = self._series.get(key)
            if s is None:
                s = self._series[key] = _Series()
            return s

        self.add_events(cols, series_of)
        if chunk.replay is not None:
            self._stream_long_nodes()

    def add_events(self, cols: FrameworkColumns, series_of: Any) -> None:
        """Hand each (node, rank, phase)'s events of `cols` to `series_of(key)` (skipped where it gives None): their
        time per context kind, then their steps (a step arriving with its events then adds their time once)."""
        in_mode = cols.mode_is(self._modes)
        is_step = cols.kind_is(STEP)
        ctx = in_mode & ~is_step & (cols.step >= 0)
        if ctx.any():
            kind_code = np.full(len(cols.kinds), _OTHER, np.int64)
            for i, k in enumerate(cols.kinds):
                if k in CONTEXT_KINDS:
                    kind_code[i] = CONTEXT_KINDS.index(k)
            for key, rows in cols.groups(ctx):
                s = series_of(key)
                if s is not None:
                    s.add_context(cols.step[rows], kind_code[cols.kind[rows]],
                                  np.maximum(cols.end[rows] - cols.start[rows], 0))
        for key, rows in cols.groups(is_step & in_mode):
            s = series_of(key)
            if s is not None:  # judged on the steps' own time: waiting for a CPU is CPUContention's
                s.add_steps(cols.step[rows], cols.start[rows],
                            own_time(cols.end[rows] - cols.start[rows], step_runq(cols, rows)), peer_runq(cols, rows))

    def _stream_long_nodes(self) -> None:
        """Where a node's steps held in memory pass NODE_BYTES, its largest series are streamed from now on, until
        half of that is held (a phase whose series are all held is not read again)."""
        from stallwatch.analyze.rules import step_stream

        for key in step_stream.too_long(self._series):
            self._streamed[key] = step_stream.StreamedSeries.of(self._series.pop(key))

    def limit_us(self, n: int, s1: int, s2: int) -> tuple[float, float, float]:
        """Mean, population std and outlier threshold (µs) from a series' exact sums."""
        mean_us = s1 / n
        std_us = math.sqrt(max(n * s2 - s1 * s1, 0) / (n * n))
        return mean_us, std_us, mean_us + float(self.params["stddev"]) * std_us

    def _judge(self, key: tuple[str, int, str], s: _Series) -> _Judged:
        """One series' verdict and Details entry: all that `result()` needs of it once its data is complete."""
        return self.judged(key, series_facts(s, self.limit_us(s.n, s.s1, s.s2)[2]))

    def judged(self, key: tuple[str, int, str], f: SeriesFacts) -> _Judged:
        """The verdict and Details entry of a series from its facts (held in memory or read again)."""
        node, rank, mode = key
        limit = self.params["n_outliers"]
        min_excess = float(self.params["min_excess_pct"])
        n, normal = f.n, f.normal
        mean_us, std_us, limit_us = self.limit_us(n, f.s1, f.s2)
        n_out = n - normal - f.excused
        p99, p95, p50 = (x / US for x in f.percentiles)
        # what the outliers cost over a typical step: a few stalls in a short loop matter, thousands of
        # sub-millisecond jitter outliers among millions of steps do not
        excess_us = max(f.outlier_us - n_out * p50 * US, 0.0)
        excess_pct = 100.0 * excess_us / f.s1 if f.s1 > 0 else 0.0
        fires = n_out > limit and excess_pct >= min_excess
        counts, edges = f.histogram
        entry = {
            "node": node, "rank": rank, "phase": mode,
            "steps": int(n),
            "step_stats": {"mean": mean_us / US, "max": f.max_us / US, "p99": p99, "p95": p95,
                           "p50": p50, "min": f.min_us / US},
            "number_of_outliers": n_out,
            "outliers_waiting_for_cpu": f.excused,
            "excess_s": excess_us / US,
            "excess_pct": excess_pct,
            "stddev": std_us / US,
            "outlier_threshold": limit_us / US,
            "triggered": bool(fires),
            "probs": (counts / counts.sum()).tolist() if normal else [],
            "binedges": (edges / US).tolist() if normal else [],
            "step_numbers": f.listed_steps.tolist(),
            "outliers": (f.listed_us / US).tolist(),
            "outlier_start_us": f.listed_starts.tolist(),
            "outliers_listed": int(f.listed_steps.size),
            "framework_context": {
                "outlier_steps": _mean_per_kind(f.outlier_context, n_out),
                "normal_steps": _mean_per_kind(f.context_totals - f.outlier_context, normal + f.excused),
            },
        }
        return _Judged(entry, bool(fires), int(n), int(n_out), int(f.outlier_us), f.outlier_context)

    def _close(self, node: str) -> None:
        """The node's data is complete: judge its series now and keep only their verdicts."""
        for key in [key for key in self._series if key[0] == node]:
            s = self._series.pop(key)
            if s.n:
                self._judged[key] = self._judge(key, s)
        streamed = {key: self._streamed.pop(key) for key in [key for key in self._streamed if key[0] == node]}
        spans = self._spans.pop(node, {})
        events, first, last = self._rates.pop(node, [0, 0, 0])
        if streamed:
            from stallwatch.analyze.rules import step_stream

            assert self._replay is not None  # series are streamed only where the run can be read again
            piece_us = step_stream.PIECE_EVENTS * (last - first + 1) // max(events, 1)
            facts = step_stream.node_facts(node, streamed, spans, self._replay,
                                           lambda s: self.limit_us(s.n, s.s1, s.s2)[2], self.add_events, piece_us)
            for key, f in facts.items():
                self._judged[key] = self.judged(key, f)

    def merge(self, other: Rule, node: str) -> None:
        """`node`'s verdicts (its series, were it never said complete) and event count: every series is one node's,
        judged on that node's steps alone, and `result()` orders them by key, so the feed's order does not show."""
        assert isinstance(other, StepOutlier)
        self._events += other._events
        self._judged.update(_of_node(other._judged, node))
        self._series.update(_of_node(other._series, node))
        self._streamed.update(_of_node(other._streamed, node))
        if node in other._spans:
            self._spans[node] = other._spans[node]
        if node in other._rates:
            self._rates[node] = other._rates[node]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a worker's rule sent back) without the run read again: the caller's rule has its own."""
        state = dict(self.__dict__)
        state["_replay"] = None
        return state

    def result(self) -> RuleResult:
        if self._events == 0:
            return self.not_applicable("no framework data: the job recorded no steps (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        for node in sorted({key[0] for key in self._streamed}):  # a node never said complete (a feed without `done`)
            self._close(node)
        series = {key: s for key, s in self._series.items() if s.n}
        if not series and not self._judged:
            which = f"{self.params['mode']} " if self.params["mode"] else ""
            return self.not_applicable(f"no {which}steps in the framework data")
        details: dict[str, Any] = {}
        triggered = violations = datapoints = 0
        phase_us: dict[str, int] = {}
        kinds_us = np.zeros(len(_CONTEXT_NAMES), np.int64)
        judged = {**self._judged, **{key: self._judge(key, s) for key, s in series.items()}}
        for key in sorted(judged, key=lambda g: (g[0], g[1], mode_order(g[2]))):
            j = judged[key]
            datapoints += j.steps
            details[rank_key(*key)] = j.entry
            if j.fires:
                triggered += 1
                violations += j.outliers
                phase_us[key[2]] = phase_us.get(key[2], 0) + j.outlier_us
                kinds_us += j.context_us
        result_details: dict[str, Any] = {
            "step_details": details,
            "phase": _percent(phase_us),
            "forward_backward": _percent({n: int(v) for n, v in zip(_CONTEXT_NAMES, kinds_us) if v > 0}),
        }
        recommendation = None
        if triggered:
            fired = [f"{key} ({e['number_of_outliers']} outliers of {e['steps']} steps, mean "
                     f"{e['step_stats']['mean']:.3g} s, max {e['step_stats']['max']:.3g} s)"
                     for key, e in details.items() if e["triggered"]]
            top = max(result_details["forward_backward"].items(), key=lambda kv: kv[1], default=None)
            label = {"outside_phases": "the loop's own code, outside data loading, forward, backward and the "
                                       "optimizer step", "data_wait": "waiting for data"}.get(top[0], top[0]) if top else ""
            extra = f" During the outlier steps most of the time went to {label} ({top[1]:.0f} %)." if top else ""
            recommendation = (f"{self.recommendation} Outliers on: {'; '.join(fired[:10])}"
                              f"{' …' if len(fired) > 10 else ''}.{extra}")
        return self.make_result(triggered=triggered, violations=violations, datapoints=datapoints,
                                details=result_details, recommendation=recommendation)


_V = TypeVar("_V")


def _of_node(by_series: dict[tuple[str, int, str], _V], node: str) -> dict[tuple[str, int, str], _V]:
    """The entries of `node`'s series (a merged worker's rule brings only its own node's)."""
    return {key: value for key, value in by_series.items() if key[0] == node}


@dataclass(frozen=True)
class _Judged:
    """A (node, rank, phase) series reduced to its verdict once its node's data is complete (a few kB, whatever
    its number of steps): the Details entry and what the run's totals add up from it."""

    entry: dict[str, Any]
    fires: bool
    steps: int
    outliers: int
    outlier_us: int  # summed durations of its outlier steps
    context_us: np.ndarray  # µs per context kind over its outlier steps


def _mean_per_kind(sums: np.ndarray, steps: int) -> dict[str, float]:
    """Mean seconds per step in each kind (kinds never seen are left out)."""
    if steps <= 0:
        return {}
    return {n: float(s) / steps / US for n, s in zip(_CONTEXT_NAMES, sums) if s > 0}


def _percent(values: dict[str, int]) -> dict[str, float]:
    total = sum(values.values())
    if total <= 0:
        return {}
    return {k: 100.0 * v / total for k, v in sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))}


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """One finding for the series that fired: the worst rank's excess over its median step is the time at stake
    (ranks run side by side)."""
    d = StepOutlierDetails.from_json(r.details)
    fired = [e for e in d.series.values() if e.triggered]
    if not fired:
        return []
    per_rank: dict[str, float] = {}
    steps: list[int] = []
    windows: list[tuple[int, int]] = []
    count = 0
    for e in fired:
        p50 = float(e.step_stats.p50 or 0.0)
        listed_excess = sum(max(float(x) - p50, 0.0) for x in e.outliers)
        rank = e.rank_key
        per_rank[rank] = per_rank.get(rank, 0.0) + float(e.excess_s if e.excess_s is not None else listed_excess)
        count += e.number_of_outliers
        steps += [int(n) for n in e.step_numbers]
        windows += [(int(t), int(t + float(x) * 1e6)) for t, x in zip(e.outlier_start_us, e.outliers)]
    stake = max(per_rank.values()) if per_rank else None  # ranks run side by side: the worst one's excess
    ranks = sorted(per_rank, key=lambda k: -per_rank[k])
    title = (f"{count} unusually slow steps cost {format_duration(stake or 0)} on "
             f"{'rank ' + ranks[0] if len(ranks) == 1 else f'{len(ranks)} ranks'}")
    parts = d.forward_backward
    mostly = max(parts.items(), key=lambda kv: kv[1])[0] if parts else None
    return [finding(r, s, "steps", title, stake, Where(sorted({k.split('/')[0] for k in ranks}), ranks,
                                                          sorted(set(steps))[:LISTED_STEPS],
                                                          sorted(windows)[:LISTED_WINDOWS]),
                    {"outlier_steps": count, "excess_s_per_rank": {k: per_rank[k] for k in ranks},
                     "outliers_mostly": mostly})]
