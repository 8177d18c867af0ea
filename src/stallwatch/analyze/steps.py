"""The training loop's steps, per node, rank and phase: how many, how long, the slowest, where a step's time
went (waiting for data, forward, backward, optimizer), each node's first and last step, and the step-time
histograms the report draws. All from one decoding of the framework columns (`FrameworkColumns`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from stallwatch.analyze.framework_frame import FrameworkColumns, mode_order
from stallwatch.records import BACKWARD, DATA_WAIT, FORWARD, OPTIMIZER, STEP

PHASES = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER)
HISTOGRAM_BINS = 60
US = 1_000_000


@dataclass(frozen=True)
class StepStat:
    node: str
    rank: int
    mode: str
    steps: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    slowest_step: int
    # share of the mode's total step time spent in each phase, in %
    phase_pct: dict[str, float] = field(default_factory=dict)
    untimed: int = 0  # steps counted but not timed (sampled steps): `steps` and the figures are the timed ones
    mean_ms: float = 0.0  # the timed steps' mean (what the phases' shares are shares of)


def columns(events: pa.Table | FrameworkColumns) -> FrameworkColumns:
    return events if isinstance(events, FrameworkColumns) else FrameworkColumns(events)


def step_stats(events: pa.Table | FrameworkColumns) -> list[StepStat]:
    """Per node, rank and mode (in that order): the steps' count, p50/p95/max and the phases' shares.
    `events`: framework events with at least the step and phase kinds."""
    cols = columns(events)
    if cols.n == 0:
        return []
    duration = cols.end - cols.start
    phase_us: dict[tuple, dict[str, int]] = {}
    for phase in PHASES:
        for key, rows in cols.groups(cols.kind_is(phase)):
            phase_us.setdefault(key, {})[phase] = int(duration[rows].sum())
    out = []
    for (node, rank, mode), rows in cols.groups(cols.kind_is(STEP)):
        d = duration[rows] / 1000.0
        total_ms = float(d.sum())
        phases = {p: 100.0 * us / 1000.0 / total_ms if total_ms > 0 else 0.0
                  for p, us in phase_us.get((node, rank, mode), {}).items()}
        slowest = int(np.argmax(d))
        out.append(StepStat(node, rank, mode, len(rows), float(np.percentile(d, 50)), float(np.percentile(d, 95)),
                            float(d[slowest]), int(cols.step[rows[slowest]]), phases, mean_ms=total_ms / len(rows)))
    out.sort(key=lambda s: (s.node, s.rank, mode_order(s.mode), s.mode))
    return out


def steps_per_mode(steps: FrameworkColumns) -> dict[str, int]:
    """Step events per mode, all ranks together, in TRAIN/EVAL/GLOBAL order. `steps` holds steps only."""
    counts = {mode: int(n) for mode, n in zip(steps.modes, np.bincount(steps.mode, minlength=len(steps.modes)))
              if n}
    return dict(sorted(counts.items(), key=lambda kv: (mode_order(kv[0]), kv[0])))


class StepStatsAccumulator:
    """`step_stats` and the loop's span over events fed a time slice at a time (in time order): per node, rank
    and mode the step durations (8 bytes a step, for exact percentiles), the phases' µs, the first start and
    last end; the events themselves are not kept. Results equal `step_stats` over all the events at once."""

    def __init__(self) -> None:
        self._durations: dict[tuple[str, int, str], list[np.ndarray]] = {}
        self._numbers: dict[tuple[str, int, str], list[np.ndarray]] = {}
        self._phase_us: dict[tuple[str, int, str], dict[str, int]] = {}
        self._spans: dict[str, tuple[int, int, int]] = {}  # node -> first start, last end, steps

    def add(self, events: pa.Table | FrameworkColumns) -> None:
        cols = columns(events)
        if cols.n == 0:
            return
        duration = cols.end - cols.start
        for phase in PHASES:
            for key, rows in cols.groups(cols.kind_is(phase)):
                sums = self._phase_us.setdefault(key, {})
                sums[phase] = sums.get(phase, 0) + int(duration[rows].sum())
        for key, rows in cols.groups(cols.kind_is(STEP)):
            self._durations.setdefault(key, []).append(duration[rows])
            self._numbers.setdefault(key, []).append(cols.step[rows])
            first, last, n = int(cols.start[rows].min()), int(cols.end[rows].max()), len(rows)
            old = self._spans.get(key[0])
            self._spans[key[0]] = (first, last, n) if old is None else (min(old[0], first), max(old[1], last),
                                                                        old[2] + n)

    def stats(self) -> list[StepStat]:
        out = []
        for key, parts in self._durations.items():
            node, rank, mode = key
            d = np.concatenate(parts) / 1000.0
            numbers = np.concatenate(self._numbers[key])
            total_ms = float(d.sum())
            phases = {p: 100.0 * us / 1000.0 / total_ms if total_ms > 0 else 0.0
                      for p, us in self._phase_us.get(key, {}).items()}
            slowest = int(np.argmax(d))
            out.append(StepStat(node, rank, mode, len(d), float(np.percentile(d, 50)), float(np.percentile(d, 95)),
                                float(d[slowest]), int(numbers[slowest]), phases, mean_ms=total_ms / len(d)))
        out.sort(key=lambda s: (s.node, s.rank, mode_order(s.mode), s.mode))
        return out

    def step_ranges(self) -> dict[tuple[str, int, str], tuple[int, int]]:
        """Per node, rank and mode, its first and last step number (≥ 0; the rank × step matrix's grid)."""
        out = {}
        for key, parts in self._numbers.items():
            numbers = np.concatenate(parts)
            numbers = numbers[numbers >= 0]
            if numbers.size:
                out[key] = (int(numbers.min()), int(numbers.max()))
        return out

    def per_mode(self) -> dict[str, int]:
        """Step events per mode, in TRAIN/EVAL/GLOBAL order (`steps_per_mode`)."""
        counts: dict[str, int] = {}
        for (_, _, mode), parts in self._durations.items():
            counts[mode] = counts.get(mode, 0) + sum(len(p) for p in parts)
        return dict(sorted(counts.items(), key=lambda kv: (mode_order(kv[0]), kv[0])))

    def spans(self) -> dict[str, LoopSpan]:
        """Per node, its loop's span (`loop_spans`)."""
        return {node: LoopSpan(*span) for node, span in sorted(self._spans.items())}


@dataclass(frozen=True)
class NodeStepSummary:
    """One node's steps, streamed: `step_stats` rows, step events per mode, its loop's span, and per (rank,
    mode) its first and last step number."""
    node: str
    stats: list[StepStat]
    per_mode: dict[str, int]
    span: LoopSpan | None
    step_ranges: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)


def merge_step_summaries(parts: list[NodeStepSummary]) -> tuple[dict[str, int], LoopSpan | None]:
    """The run's step events per mode and its loop's span (`steps_per_mode`, `loop_span`) from its nodes'."""
    counts: dict[str, int] = {}
    for p in parts:
        for mode, n in p.per_mode.items():
            counts[mode] = counts.get(mode, 0) + n
    spans = [p.span for p in parts if p.span is not None]
    loop = LoopSpan(min(s.first_us for s in spans), max(s.last_us for s in spans), sum(s.steps for s in spans)) \
        if spans else None
    return dict(sorted(counts.items(), key=lambda kv: (mode_order(kv[0]), kv[0]))), loop


@dataclass(frozen=True)
class LoopSpan:
    """A node's (or the run's) training loop: first step's start, last step's end, how many steps."""
    first_us: int
    last_us: int
    steps: int


def loop_spans(steps: FrameworkColumns) -> dict[str, LoopSpan]:
    """Per node, its training loop's span; `steps` holds step events only."""
    out = {}
    for code, node in enumerate(steps.nodes):
        mine = steps.node == code
        if mine.any():
            out[node] = LoopSpan(int(steps.start[mine].min()), int(steps.end[mine].max()), int(mine.sum()))
    return dict(sorted(out.items()))


def loop_span(steps: FrameworkColumns) -> LoopSpan | None:
    """The run's training loop over every node and rank (None without steps)."""
    if steps.n == 0:
        return None
    return LoopSpan(int(steps.start.min()), int(steps.end.max()), steps.n)


@dataclass(frozen=True)
class NodeSteps:
    """One node's step durations binned for its histogram: shared `edges` (s) and, per (rank, phase), the
    share of that series' steps in each bin."""
    node: str
    edges: np.ndarray
    shares: dict[tuple[int, str], np.ndarray]


def step_histograms(steps: FrameworkColumns, modes: set[str], bins: int = HISTOGRAM_BINS) -> list[NodeSteps]:
    """Per node, every step of the phases in `modes` (outliers included) in `bins` log-spaced bins from its
    shortest to its longest step: a slow first step and the normal ones show on one axis."""
    if steps.n == 0:
        return []
    seconds = (steps.end - steps.start) / US
    wanted = steps.mode_is(modes) & (seconds > 0)
    out = []
    for code in sorted(range(len(steps.nodes)), key=lambda c: steps.nodes[c]):
        series = {(rank, mode): seconds[rows] for (_, rank, mode), rows in steps.groups(wanted & (steps.node == code))}
        hist = node_histogram(steps.nodes[code], series, bins)
        if hist is not None:
            out.append(hist)
    return out


def node_histogram(node: str, series: dict[tuple[int, str], np.ndarray],
                   bins: int = HISTOGRAM_BINS) -> NodeSteps | None:
    """One node's histogram (`step_histograms`) from its step durations in seconds per (rank, mode); None
    without any."""
    series = {key: d for key, d in series.items() if d.size}
    if not series:
        return None
    lo = min(float(d.min()) for d in series.values())
    hi = max(float(d.max()) for d in series.values())
    edges = np.geomspace(lo, hi, bins + 1) if hi > lo * 1.001 else np.array([lo * 0.999, hi * 1.001])
    shares = {key: np.histogram(d, bins=edges)[0] / d.size for key, d in series.items()}
    return NodeSteps(node, edges, dict(sorted(shares.items(), key=lambda kv: (kv[0][0], mode_order(kv[0][1])))))


def node_rank_mode(steps: FrameworkColumns, node: str, rank: int, mode: str) -> np.ndarray:
    """Rows of one node, rank and mode."""
    node_code = steps.nodes.index(node) if node in steps.nodes else -1
    return (steps.node == node_code) & (steps.rank == rank) & steps.mode_is([mode])


@dataclass(frozen=True)
class LoopShapes:
    """How each rank's steps were delimited, from its `loop` markers: `sources` maps a source (loader,
    explicit, optimizer, pairs, undetermined) to the node/rank places that used it."""
    sources: dict[str, list[str]]
    forwards: int = 0  # top-level forward calls in the loops whose boundary could not be found

    @property
    def undetermined(self) -> list[str]:
        return self.sources.get("undetermined", [])

    def notes(self) -> list[str]:
        """Steps inferred from the model's calls are said; a loop whose iteration boundary could not be found
        is flagged (its step count means nothing)."""
        notes = []
        if self.undetermined:
            notes.append(f"the training loop's iteration boundary could not be found on {_list(self.undetermined)}: "
                         f"{self.forwards} top-level forward calls with no backward, no optimizer.step() and no "
                         "DataLoader, so its step count means nothing; mark steps with "
                         "stallwatch.torch.profile().step()")
        if self.sources.get("pairs") and not self.sources.get("loader") and not self.sources.get("explicit"):
            notes.append("no DataLoader and no optimizer.step(): each top-level forward and its backward was "
                         f"counted as one training step ({_list(self.sources['pairs'])})")
        return notes


def loop_shapes(markers: pa.Table) -> LoopShapes:
    """`markers`: the run's `loop` events (node, rank, name, args)."""
    by_source: dict[str, set[str]] = {}
    forwards = 0
    for row in markers.select(["node", "rank", "name", "args"]).to_pylist():
        by_source.setdefault(str(row["name"]), set()).add(f"{row['node']}/rank {row['rank']}")
        if row["name"] == "undetermined":
            try:
                forwards += int(json.loads(row["args"] or "{}").get("forwards", 0))
            except (ValueError, TypeError, AttributeError):
                pass
    return LoopShapes({k: sorted(v) for k, v in by_source.items()}, forwards)


def _list(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")
