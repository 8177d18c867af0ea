"""Where a `RunAnalysis` reads its whole-run figures from, chosen once when it is built: `ExactSource` reads every
event and snapshot (the report: exact), `RollupSource` the per-minute rollups (the dashboard: a day of eight nodes
opens in a second) and falls back to the exact reads where the rollups are too coarse. Both answer the one
`Source` protocol, so the façade delegates and never asks which it has."""

from __future__ import annotations

from typing import Any, Iterable, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze import compare as _compare
from stallwatch.analyze import loss as _loss
from stallwatch.analyze import node_series as _node_series
from stallwatch.analyze import rollup_views as _rollup_views
from stallwatch.analyze import step_window as _step_window
from stallwatch.analyze import steps as _steps
from stallwatch.analyze.frames import NodeFrame, node_frame
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.usage import UsageStat, usage_metrics, usage_stats_wide
from stallwatch.records import LOOP, LOSS, MODES, OVERHEAD, STEP, UNTIMED
from stallwatch.store.reader import Run
from stallwatch.store.rollup_codec import SYSTEM_LEVELS_US

MAX_PROGRESS_STEPS = 200_000  # a short run's progress is drawn from its step events up to this many
MIN_ROLLUP_BUCKETS = 30  # a whole-run framework timeline of fewer minutes is bucketed from the events, finer
BUCKETS_ONLY: frozenset[str] = frozenset()  # a system rollup view of the buckets alone: counts, spans, gaps
USAGE_BUCKETS = 2000  # enough bucket means for a p95; a day of 10 s buckets (8,640 per node) costs 6x the time
_USAGE_METRICS = frozenset(usage_metrics())
_MARKER_KINDS = [LOOP, LOSS, OVERHEAD, UNTIMED]


class RunReads(Protocol):
    """What a source reads through its analysis: the run and the reads the analysis caches for every question."""

    @property
    def run(self) -> Run: ...
    @property
    def framework_rollup(self) -> pa.Table: ...
    @property
    def steps(self) -> FrameworkColumns: ...
    @property
    def sample_interval_ms(self) -> dict[str, float]: ...
    @property
    def node_step_totals(self) -> list[_steps.NodeStepSummary]: ...
    def node_info(self, node: str) -> dict[str, Any]: ...
    def system(self, node: str, metrics: Iterable[str] | None = None) -> NodeFrame: ...
    def system_in_memory(self, node: str) -> bool: ...
    def system_rollup(self, node: str, level_us: int = ..., metrics: frozenset[str] | None = None) -> pa.Table: ...


class Source(Protocol):
    """The whole-run figures a `RunAnalysis` delegates, each the same question for either source."""

    def step_counts(self) -> dict[str, int]:
        """Per mode, the timed steps of the run."""
    def loop_span(self) -> _steps.LoopSpan | None:
        """From the first step's start to the last step's end, over every rank."""
    def markers(self) -> pa.Table:
        """The rare marker events: how steps were found, what was lost, what stallwatch cost, untimed steps."""
    def measured_interval_ms(self, node: str) -> float:
        """The node's sampling interval as its data shows it (for a node whose record does not say)."""
    def sample_gaps(self, node: str, interval_ms: float | None,
                    changes: list[tuple[int, float]]) -> list[_loss.SampleGap]:
        """Stretches of the node without snapshots."""
    def phase_shares(self) -> dict[str, dict[str, float]]:
        """Per mode, each phase's share of step time, %."""
    def usage(self, node: str) -> list[UsageStat]:
        """The node's utilization statistics."""
    def node_series(self, node: str, start_us: int | None, end_us: int | None,
                    buckets: int) -> _node_series.NodeSeries:
        """The node's series in [start_us, end_us), min / max / mean per bucket."""
    def last_sample_us(self, node: str) -> int | None:
        """When the node's latest snapshot was taken."""
    def timed_step_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """When timed steps ended and how many ended then (for progress with untimed steps)."""
    def progress(self, points: int) -> dict[str, list[Any]]:
        """Training steps done over time, at most `points` points."""
    def latest_step(self) -> int | None:
        """The highest step number recorded."""
    def run_totals(self, node: str, limit: int) -> _step_window.EventsWindow | None:
        """The node's whole-run events window from totals alone; None when its events are to be read."""
    def recent_steps_from(self, node: str, wanted: int) -> int | None:
        """When the node's last `wanted` steps began (None without steps)."""
    def steps_for_marks(self) -> FrameworkColumns | None:
        """The step events where marking steps is cheap (they are read anyway); None where it is not."""


class ExactSource:
    """Every event and snapshot, read through the analysis's caches: exact, and as slow as the run is long."""

    def __init__(self, data: RunReads) -> None:
        self.data = data

    def step_counts(self) -> dict[str, int]:
        return _steps.merge_step_summaries(self.data.node_step_totals)[0]

    def loop_span(self) -> _steps.LoopSpan | None:
        return _steps.merge_step_summaries(self.data.node_step_totals)[1]

    def markers(self) -> pa.Table:
        return self.data.run.framework(kinds=_MARKER_KINDS, fields=["kind", "name", "mode", "start_us", "end_us", "args"])

    def measured_interval_ms(self, node: str) -> float:
        return NodeFrame(node, self.data.system(node, ()).timestamps, {}, {}).sample_interval_ms

    def sample_gaps(self, node: str, interval_ms: float | None,
                    changes: list[tuple[int, float]]) -> list[_loss.SampleGap]:
        return _loss.sample_gaps(node, self.data.system(node, ()).timestamps, interval_ms, changes)

    def phase_shares(self) -> dict[str, dict[str, float]]:
        events = self.data.run.framework(kinds=list(_steps.PHASES), fields=["kind", "mode", "step", "start_us", "end_us"])
        return _compare.phase_shares(self.data.steps.table, events)

    def usage(self, node: str) -> list[UsageStat]:
        frame = self.data.system(node, usage_metrics())
        return usage_stats_wide(node, pa.table({"timestamp_us": frame.timestamps, **frame.columns}))

    def node_series(self, node: str, start_us: int | None, end_us: int | None,
                    buckets: int) -> _node_series.NodeSeries:
        return _node_series.node_series(self.data.system(node, _node_series.METRICS), start_us, end_us, buckets)

    def last_sample_us(self, node: str) -> int | None:
        ts = self.data.system(node, ()).timestamps
        return int(ts[-1]) if len(ts) else None

    def timed_step_ends(self) -> tuple[np.ndarray, np.ndarray]:
        t = self.data.steps.end
        return t, np.ones(len(t), np.int64)

    def steps_for_marks(self) -> FrameworkColumns | None:
        return self.data.steps

    def progress(self, points: int) -> dict[str, list[Any]]:
        cols = self.data.steps
        if not cols.n:
            return {"t": [], "steps": []}
        ends = np.sort(cols.end)
        idx = np.unique(np.linspace(0, len(ends) - 1, min(points, len(ends))).astype(np.int64))
        return {"t": ends[idx].tolist(), "steps": (idx + 1).tolist()}

    def latest_step(self) -> int | None:
        cols = self.data.steps
        return int(cols.step.max()) if cols.n else None

    def run_totals(self, node: str, limit: int) -> _step_window.EventsWindow | None:
        return None

    def recent_steps_from(self, node: str, wanted: int) -> int | None:
        cols = self.data.steps
        if not cols.n or node not in cols.nodes:
            return None
        starts = np.sort(cols.start[np.flatnonzero(cols.node == cols.nodes.index(node))])
        return int(starts[-min(len(starts), wanted)])


class RollupSource:
    """The per-minute rollups (kilobytes for a day): whole-run figures in a second; a zoom narrower than a rollup
    level, and a short run's curves, are read exactly (`ExactSource`)."""

    def __init__(self, data: RunReads) -> None:
        self.data = data
        self.exact = ExactSource(data)
        self._usage: dict[str, list[UsageStat]] = {}  # the table and the cost ask for it

    def step_counts(self) -> dict[str, int]:
        return _rollup_views.steps_per_mode(self.data.framework_rollup)

    def loop_span(self) -> _steps.LoopSpan | None:
        return _rollup_views.loop_span(self.data.framework_rollup)

    def markers(self) -> pa.Table:
        return _rollup_views.markers(self.data.framework_rollup)  # kept verbatim in the rollups

    def measured_interval_ms(self, node: str) -> float:
        rows = self.data.system_rollup(node, metrics=BUCKETS_ONLY)
        return _rollup_views.sample_interval_ms(rows) or self.exact.measured_interval_ms(node)

    def sample_gaps(self, node: str, interval_ms: float | None,
                    changes: list[tuple[int, float]]) -> list[_loss.SampleGap]:
        return _rollup_views.sample_gaps(node, self.data.system_rollup(node, metrics=BUCKETS_ONLY), interval_ms, changes)

    def phase_shares(self) -> dict[str, dict[str, float]]:
        return _rollup_views.phase_shares(self.data.framework_rollup, MODES, _steps.PHASES)

    def usage(self, node: str) -> list[UsageStat]:
        """From the finest rollup with at most `USAGE_BUCKETS` buckets: p50 / p95 then of its bucket means."""
        if node not in self._usage:
            level = usage_level_us(self.data.system_rollup(node, metrics=BUCKETS_ONLY).num_rows)
            self._usage[node] = _rollup_views.usage(node, self.data.system_rollup(node, level, metrics=_USAGE_METRICS))
        return self._usage[node]

    def node_series(self, node: str, start_us: int | None, end_us: int | None,
                    buckets: int) -> _node_series.NodeSeries:
        """A range wide enough for a rollup level from the coarsest level that fills `buckets`; a narrower one
        (zooming in) reads the snapshots of its range only, at full resolution."""
        coarse = self._rollup_series(node, start_us, end_us, buckets)
        if coarse is not None:
            return coarse
        if start_us is not None and end_us is not None and not self.data.system_in_memory(node):
            frame = node_frame(node, self.data.run.system_wide(node, start_us, end_us, metrics=_node_series.METRICS),
                               self.data.node_info(node))
            return _node_series.node_series(frame, start_us, end_us, buckets)
        return self.exact.node_series(node, start_us, end_us, buckets)

    def _rollup_series(self, node: str, start_us: int | None, end_us: int | None,
                       buckets: int) -> _node_series.NodeSeries | None:
        finest = self.data.system_rollup(node, metrics=BUCKETS_ONLY)
        if not finest.num_rows:
            return None
        lo = int(finest["first_us"][0].as_py()) if start_us is None else start_us
        hi = int(finest["last_us"][-1].as_py()) + 1 if end_us is None else end_us
        level = _rollup_views.pick_level(hi - lo, buckets, self.data.sample_interval_ms.get(node))
        if level is None:
            return None
        return _rollup_views.node_series(self.data.system_rollup(node, level), node, start_us, end_us, buckets)

    def last_sample_us(self, node: str) -> int | None:
        rows = self.data.system_rollup(node, metrics=BUCKETS_ONLY)
        return int(pc.max(rows["last_us"]).as_py()) if rows.num_rows else None

    def steps_for_marks(self) -> FrameworkColumns | None:
        return None  # a day of step events is not read to place a few marks

    def timed_step_ends(self) -> tuple[np.ndarray, np.ndarray]:
        fw = self.data.framework_rollup
        timed = fw.filter(pc.equal(fw["kind"], STEP))
        return timed["last_us"].to_numpy(zero_copy_only=False), timed["count"].to_numpy(zero_copy_only=False)

    def progress(self, points: int) -> dict[str, list[Any]]:
        """Per minute; a run of a few minutes has a few per-minute points: its steps, few, draw the curve."""
        coarse = _rollup_views.progress(self.data.framework_rollup, points)
        if len(coarse["t"]) >= MIN_ROLLUP_BUCKETS or not coarse["t"] or coarse["steps"][-1] > MAX_PROGRESS_STEPS:
            return coarse
        return self.exact.progress(points)

    def latest_step(self) -> int | None:
        return _rollup_views.latest_step(self.data.framework_rollup)

    def run_totals(self, node: str, limit: int) -> _step_window.EventsWindow | None:
        """The totals from the rollups when the events are many and span enough minutes (a shorter run is drawn
        from its events)."""
        fw, kinds = self.data.framework_rollup, _step_window.EVENT_KINDS
        totals, steps, total = _rollup_views.event_totals(fw, node, kinds)
        if total <= limit or _rollup_views.bucket_count(fw, node) < MIN_ROLLUP_BUCKETS:
            return None
        return _step_window.EventsWindow(None, None, [_step_window.KindTotal(k, *totals[k]) for k in kinds
                                                      if k in totals],
                                         steps, [], True, total, _rollup_views.event_buckets(fw, node, kinds))

    def recent_steps_from(self, node: str, wanted: int) -> int | None:
        return _rollup_views.node_step_start(self.data.framework_rollup, node, wanted)


def open_source(data: RunReads, *, from_rollups: bool) -> Source:
    """The source a `RunAnalysis` reads its whole-run figures from: the rollups (the dashboard) or every event."""
    return RollupSource(data) if from_rollups else ExactSource(data)


def usage_level_us(buckets: int) -> int:
    """The rollup level whose bucket means give a node's utilization percentiles, for a node of `buckets` finest
    buckets: the finest with at most `USAGE_BUCKETS` (10 s up to ~5 h, 1 min up to ~33 h, then 10 min)."""
    finest = SYSTEM_LEVELS_US[0]
    return next((lvl for lvl in SYSTEM_LEVELS_US if buckets * finest / lvl <= USAGE_BUCKETS), SYSTEM_LEVELS_US[-1])
