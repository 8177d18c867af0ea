"""The per-node work of an analysis, as tasks an engine (analyze.engine) can run anywhere: each opens the run
at `uri` itself, reads one node an hour at a time and returns a small typed result, so memory and the bytes
sent back are bounded by one node-hour, whatever the number of nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from stallwatch.analyze import steps as _steps
from stallwatch.analyze.downsample import minmax
from stallwatch.records import STEP, TIMESTAMP
from stallwatch.store.reader import Run, open_run

NODE_SLICE_US = 3600 * 1_000_000  # one node's events are read an hour at a time


def node_steps_task(uri: str, node: str, with_stats: bool = True) -> _steps.NodeStepSummary:
    """On a worker: `node_steps` of the run at `uri`."""
    return node_steps(open_run(uri), node, with_stats)


def node_steps(run: Run, node: str, with_stats: bool = True) -> _steps.NodeStepSummary:
    """One node's step statistics, step counts per mode and loop span (`steps.StepStatsAccumulator`); without
    `with_stats` only the step events are read (a fifth of them) and `stats` is empty."""
    run = run.pinned(node=node)  # its own folders listed: the node's slices of time, not the whole run's
    acc = _steps.StepStatsAccumulator()
    kinds = [STEP, *_steps.PHASES] if with_stats else [STEP]
    for a, b in run.event_slices(NODE_SLICE_US):
        acc.add(run.framework(a, b, kinds=kinds, nodes=[node], starting=True,
                              fields=("kind", "mode", "step", "start_us", "end_us")))
    spans = acc.spans()
    ranges = {(rank, mode): r for (_, rank, mode), r in acc.step_ranges().items()}
    return _steps.NodeStepSummary(node, acc.stats() if with_stats else [], acc.per_mode(), spans.get(node), ranges)


@dataclass(frozen=True)
class NodeTimeline:
    """One node's part of a timeline export: its framework events, and per exported system column its
    timestamps and values (scaled, then min/max-downsampled to at most `max_points`)."""
    node: str
    events: pa.Table
    counters: list[tuple[str, np.ndarray, np.ndarray]]


def node_timeline_task(uri: str, node: str, **kwargs: object) -> NodeTimeline:
    """On a worker: `node_timeline` of the run at `uri`."""
    return node_timeline(open_run(uri), node, **kwargs)  # type: ignore[arg-type]


def node_timeline(run: Run, node: str, *, start_us: int | None, end_us: int | None, events_end_us: int | None,
                  metrics: frozenset[str] | None, max_points: int,
                  scale_of: Callable[[str], float | None]) -> NodeTimeline:
    """Events overlapping [start_us, events_end_us) and the columns `scale_of` gives a scale (None: not
    exported) of the snapshots in [start_us, end_us)."""
    run = run.pinned(node=node, keep_recent=False)  # its own folders listed, once for both reads
    events = run.framework(start_us=start_us, end_us=events_end_us, nodes=[node])
    table = run.system_wide(node, start_us=start_us, end_us=end_us, metrics=metrics)
    counters = []
    if table.num_rows:
        ts_all = table[TIMESTAMP].to_numpy()
        for column in sorted(c for c in table.column_names if c != TIMESTAMP):
            scale = scale_of(column)
            if scale is None:
                continue
            values = table[column].to_numpy(zero_copy_only=False).astype(np.float64)
            ok = np.isfinite(values)
            ts, values = ts_all[ok], values[ok] * scale
            if not len(ts):
                continue
            if len(ts) > max_points:
                ts, values = minmax(ts, values, max_points // 2)
            counters.append((column, ts, values))
    return NodeTimeline(node, events, counters)
