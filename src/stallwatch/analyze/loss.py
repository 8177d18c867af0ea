"""What a run is missing, said instead of hidden: framework events a process had to drop (recorded as
`loss` events by the sampler) and stretches without system snapshots (a stopped or restarted sampler).
A run that lost steps must not read as if it were complete."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from stallwatch.analyze.frames import intervals_at
from stallwatch.timeutil import format_duration, format_us

MIN_GAP_US = 2_000_000  # a missing stretch shorter than this is a busy machine's jitter, not a loss
GAP_INTERVALS = 3  # ... and so is one of fewer than this many sampling intervals


@dataclass(frozen=True)
class EventLoss:
    """Events of one rank that were never recorded, and the span of their start times."""

    node: str
    rank: int
    events: int
    steps: int
    first_us: int
    last_us: int


@dataclass(frozen=True)
class SampleGap:
    """A stretch of a node's recording without system snapshots."""

    node: str
    start_us: int
    end_us: int


@dataclass
class Losses:
    events: list[EventLoss] = field(default_factory=list)
    gaps: list[SampleGap] = field(default_factory=list)

    @property
    def steps_lost(self) -> int:
        return sum(e.steps for e in self.events)

    def notes(self) -> list[str]:
        out = []
        for e in self.events:
            what = f"{e.steps:,} steps ({e.events:,} events)" if e.steps else f"{e.events:,} events"
            out.append(f"{what} of rank {e.rank} on {e.node} were lost between {format_us(e.first_us)} and "
                       f"{format_us(e.last_us)}: the sampler could not take them (stalled or restarting); "
                       "step counts and times there are incomplete")
        for g in self.gaps:
            out.append(f"no system samples on {g.node} for {format_duration((g.end_us - g.start_us) / 1e6)} "
                       f"({format_us(g.start_us)} → {format_us(g.end_us)}): the sampler was stopped or "
                       "restarted; utilization there is unknown")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"events": [e.__dict__ for e in self.events], "sample_gaps": [g.__dict__ for g in self.gaps]}


def event_losses(table: pa.Table) -> list[EventLoss]:
    """Per node and rank, the `loss` events (`Run.framework(kinds=[LOSS])`) summed over the run."""
    acc: dict[tuple[str, int], list[int]] = {}
    for row in table.select(["node", "rank", "start_us", "end_us", "args"]).to_pylist():
        try:
            args = json.loads(row["args"] or "{}")
            events, steps = int(args.get("events", 0)), int(args.get("steps", 0))
        except (ValueError, TypeError, AttributeError):
            continue
        a = acc.setdefault((row["node"], row["rank"]), [0, 0, row["start_us"], row["end_us"]])
        a[0] += max(events, 0)
        a[1] += max(steps, 0)
        a[2], a[3] = min(a[2], row["start_us"]), max(a[3], row["end_us"])
    return [EventLoss(node, rank, *values) for (node, rank), values in sorted(acc.items())]


def sample_gaps(node: str, timestamps: np.ndarray, interval_ms: float | None,
                changes: list[tuple[int, float]] | None = None) -> list[SampleGap]:
    """Stretches between consecutive snapshots longer than GAP_INTERVALS intervals and MIN_GAP_US. After a
    live change of the interval (`changes`, see `NodeFrame.interval_changes`) each stretch is judged against
    the longer of the intervals in force at its two ends."""
    if len(timestamps) < 2:
        return []
    ts = np.sort(np.asarray(timestamps, dtype=np.int64))
    limit = gap_limits_us(ts[:-1], ts[1:], interval_ms, changes)
    where = np.flatnonzero(np.diff(ts) > limit)
    return [SampleGap(node, int(ts[i]), int(ts[i + 1])) for i in where]


def gap_limits_us(starts: np.ndarray, ends: np.ndarray, interval_ms: float | None,
                  changes: list[tuple[int, float]] | None = None) -> np.ndarray:
    """The longest stretch without a snapshot that is no gap, for stretches [starts, ends): GAP_INTERVALS of
    the longer interval in force at either end, and at least MIN_GAP_US."""
    ms = np.maximum(intervals_at(changes or [], starts, interval_ms or 0.0),
                    intervals_at(changes or [], ends, interval_ms or 0.0))
    return np.maximum(MIN_GAP_US, (GAP_INTERVALS * ms * 1000).astype(np.int64))


def damaged_notes(paths: list[str]) -> list[str]:
    """Files of the run that could not be read (a checksum that fails, a cut file): their rows are lost, said."""
    if not paths:
        return []
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return [f"{len(paths)} damaged file{'s' if len(paths) > 1 else ''} of the run could not be read and "
            f"{'are' if len(paths) > 1 else 'is'} left out (what {'they' if len(paths) > 1 else 'it'} held is "
            f"lost): {shown}"]
