"""The report's views of every step, one node at a time: its step-duration histogram, its rows of the rank ×
step matrix, its training stretches and the cost of its detailed-profiling windows, accumulated from the node's
events read an hour at a time. The report then holds one node's step durations at most (8 bytes a step), never
the run's steps; the results are those of the whole-run functions (`steps.step_histograms`, `ranks.rank_steps`,
`timeline.phase_spans`, `cost.window_costs`) given the same grid and gaps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze import steps as _steps
from stallwatch.analyze.cost import WindowCost, window_costs
from stallwatch.analyze.ranks import RankCells, StepGrid
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.timeline import merge_intervals
from stallwatch.records import DATA_WAIT, STEP
from stallwatch.store.reader import Run, open_run

NODE_SLICE_US = 3600 * 1_000_000  # one node's events are read an hour at a time
FIELDS = ("kind", "mode", "step", "start_us", "end_us")


@dataclass(frozen=True)
class DigestPlan:
    """What to accumulate (None / empty: nothing of that kind): the histograms' modes, the rank × step grid,
    each mode's stretch gap, and the detailed-profiling windows of the node with their place in the run's list."""
    hist_modes: frozenset[str] = frozenset()
    grid: StepGrid | None = None
    gaps_us: Mapping[str, int] = field(default_factory=dict)
    windows: Sequence[tuple[int, Mapping[str, Any]]] = ()

    @property
    def empty(self) -> bool:
        return not (self.hist_modes or self.grid or self.gaps_us or self.windows)


@dataclass
class NodeStepDigest:
    """One node's part of each view; `intervals` maps a mode to its merged stretches; `windows` pairs a
    window's place in the run's list with its cost."""
    node: str
    histogram: _steps.NodeSteps | None
    cells: RankCells | None
    intervals: dict[str, list[tuple[int, int]]]
    windows: list[tuple[int, WindowCost]]


class StepDigestAccumulator:
    """Fed one node's step and data-wait events a slice at a time; keeps the durations of the histogram's
    series, the grid's sums, the merged stretches, and the steps of ranks with a profiling window."""

    def __init__(self, node: str, plan: DigestPlan) -> None:
        self.node, self.plan = node, plan
        self._durations: dict[tuple[int, str], list[np.ndarray]] = {}
        self._cells = RankCells(plan.grid, {node}) if plan.grid is not None else None
        self._intervals: dict[str, list[tuple[int, int]]] = {}
        self._windowed = {(int(w["rank"]), str(w.get("mode") or "TRAIN")) for _, w in plan.windows
                          if isinstance(w.get("rank"), int)}
        self._kept: list[pa.Table] = []

    def add(self, events: pa.Table) -> None:
        """Events of this node (step and data-wait kinds; others are ignored)."""
        kind = events["kind"].cast(pa.string())
        steps = events.filter(pc.equal(kind, STEP))
        cols = FrameworkColumns(steps)
        if cols.n:
            self._add_steps(steps, cols)
        if self._cells is not None:
            waits = events.filter(pc.equal(kind, DATA_WAIT))
            self._cells.add(cols, FrameworkColumns(waits) if waits.num_rows else None)

    def _add_steps(self, table: pa.Table, cols: FrameworkColumns) -> None:
        duration = cols.end - cols.start
        if self.plan.hist_modes:
            wanted = cols.mode_is(self.plan.hist_modes) & (duration > 0)
            for (_, rank, mode), rows in cols.groups(wanted):
                self._durations.setdefault((rank, mode), []).append(duration[rows] / _steps.US)
        for mode, gap in self.plan.gaps_us.items():
            sel = cols.mode_is([mode])
            if sel.any():
                have = self._intervals.setdefault(mode, [])
                have += merge_intervals(cols.start[sel], cols.end[sel], gap)
                if len(have) > 64:  # merge as it grows: a node's stretches stay few
                    self._intervals[mode] = _remerge(have, gap)
        if self._windowed:
            keep = np.zeros(cols.n, bool)
            for (_, rank, mode), rows in cols.groups(np.ones(cols.n, bool)):
                if (rank, mode) in self._windowed:
                    keep[rows] = True
            if keep.any():
                self._kept.append(table.filter(pa.array(keep)))

    def result(self) -> NodeStepDigest:
        series = {key: np.concatenate(parts) for key, parts in self._durations.items()}
        histogram = _steps.node_histogram(self.node, series) if series else None
        intervals = {mode: _remerge(parts, self.plan.gaps_us[mode]) for mode, parts in self._intervals.items()}
        costs: list[tuple[int, WindowCost]] = []
        if self.plan.windows and self._kept:
            cols = FrameworkColumns(pa.concat_tables(self._kept))
            for (at, window) in self.plan.windows:
                costs += [(at, c) for c in window_costs(cols, [window], others=[w for _, w in self.plan.windows])]
        return NodeStepDigest(self.node, histogram, self._cells, intervals, costs)


def _remerge(parts: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    return merge_intervals(np.array([a for a, _ in parts], np.int64), np.array([b for _, b in parts], np.int64), gap)


def node_event_slices(run: Run, node: str, kinds: list[str]) -> Iterator[pa.Table]:
    """One node's events of `kinds` (FIELDS), `NODE_SLICE_US` of time at a time, each event in the slice it starts
    in: what holds one node's slice of events, never the run's."""
    run = run.pinned(node=node)  # its own folders listed: the node's slices of time, not the whole run's
    for a, b in run.event_slices(NODE_SLICE_US):
        yield run.framework(a, b, kinds=kinds, nodes=[node], starting=True, fields=FIELDS)


def node_step_digest(run: Run, node: str, plan: DigestPlan) -> NodeStepDigest:
    """One node's digest: its step (and, for the grid, data-wait) events read `NODE_SLICE_US` at a time."""
    acc = StepDigestAccumulator(node, plan)
    for events in node_event_slices(run, node, [STEP, DATA_WAIT] if plan.grid is not None else [STEP]):
        acc.add(events)
    return acc.result()


def node_step_digest_task(uri: str, node: str, plan: DigestPlan) -> NodeStepDigest:
    """On a worker: `node_step_digest` of the run at `uri`."""
    return node_step_digest(open_run(uri), node, plan)
