"""The ground floor of analysis: the system snapshots of one node as numpy columns (`NodeFrame`), what rules,
statistics and charts compute on (built once from the store's wide table, float32 as stored, time-ordered); and the
`Chunk` of new data a rule is handed at each evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Protocol

import numpy as np
import pyarrow as pa

from stallwatch.records import COLUMN_SEP, TIMESTAMP


@dataclass
class NodeFrame:
    """New system snapshots of one node, in time order: timestamps (µs) and one float array per
    `device/metric` column (float32 as stored; NaN where a value is missing); `info` is the node's record
    (cores, GPUs…)."""

    node: str
    timestamps: np.ndarray
    columns: dict[str, np.ndarray]
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.timestamps)

    def devices(self, prefix: str, metric: str) -> list[str]:
        """Numbered devices with this metric, in number order: devices("gpu", "gpu_util") -> ["gpu0", …]."""
        found = []
        for col in self.columns:
            device, _, m = col.partition(COLUMN_SEP)
            if m == metric and device.startswith(prefix) and device[len(prefix):].isdigit():
                found.append(device)
        return sorted(found, key=lambda d: int(d[len(prefix):]))

    def get(self, device: str, metric: str) -> np.ndarray | None:
        """The series, or None where this frame has none: a node without that device or metric, or a frame with
        no rows (a chunk lists every node, with rows or not)."""
        return self.columns.get(f"{device}{COLUMN_SEP}{metric}")

    def matrix(self, devices: list[str], metric: str) -> np.ndarray:
        """snapshots × devices (NaN where missing)."""
        if not devices:
            return np.empty((len(self), 0))
        return np.column_stack([self.columns.get(f"{d}{COLUMN_SEP}{metric}", np.full(len(self), np.nan))
                                for d in devices])

    @property
    def sample_interval_ms(self) -> float:
        """The node's sampling interval: its record's, else the median spacing of these snapshots (0 when
        neither is known). The one place the interval is resolved; every analysis asks here."""
        value = (self.info or {}).get("sample_interval_ms")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 3_600_000:
            return float(value)
        if len(self) > 1:
            return max(float(np.median(np.diff(self.timestamps))) / 1000.0, 0.001)
        return 0.0

    @property
    def interval_changes(self) -> list[tuple[int, float]]:
        """The node record's live interval changes: (from µs, interval ms) in time order; empty when the
        interval never changed."""
        return interval_changes(self.info)

    def intervals_ms(self, timestamps: np.ndarray | None = None) -> np.ndarray:
        """The interval in force at each snapshot (or at `timestamps`): what a snapshot stands for, and what a
        gap after it is judged against."""
        ts = self.timestamps if timestamps is None else timestamps
        return intervals_at(self.interval_changes, ts, self.sample_interval_ms)


@dataclass
class Chunk:
    """What a rule is handed at each evaluation: the data that is new since the last one. (Rules may cache
    what they derive from it on the instance, outside the fields: see `framework_frame.framework_columns`.)"""

    system: dict[str, NodeFrame]
    framework: pa.Table  # framework events (stallwatch.records.framework_schema), new since the last chunk
    run: dict[str, Any] = field(default_factory=dict)  # Run.info: run.json merged with every node's record
    final: bool = False  # the run has ended: nothing more will come
    # nodes whose data is complete with this chunk: no later chunk holds a row of theirs, so a rule may reduce
    # their per-step state to a summary now (batch feeds node by node; live leaves it empty until `final`)
    done: frozenset[str] = frozenset()
    # batch feeds only: the run read again in pieces (`Replay`), for a rule whose verdict compares ranks across
    # nodes step by step and so cannot reduce a finished node to a summary: it keeps where to look instead; None
    # when live
    replay: Replay | None = field(default=None, compare=False, repr=False)


class Replay(Protocol):
    """The run read again, piece by piece: for each (node, start µs, end µs) of `pieces`, in order, a chunk of
    that node's framework events of `kinds` (None: all) that start in [start, end) (node, rank and `fields`)."""

    def __call__(self, pieces: Iterable[tuple[str, int, int]], *, kinds: tuple[str, ...] | None,
                 fields: tuple[str, ...]) -> Iterator[Chunk]: ...


def interval_changes(info: dict[str, Any] | None) -> list[tuple[int, float]]:
    """(from µs, interval ms) of a node record's `sample_intervals` (checked by the store), sorted; [] when it
    holds a single interval."""
    entries = (info or {}).get("sample_intervals") or []
    out = sorted((int(e["from_us"]), float(e["sample_interval_ms"])) for e in entries
                 if isinstance(e, dict) and "from_us" in e and "sample_interval_ms" in e)
    return out if len({ms for _, ms in out}) > 1 else []


def intervals_at(changes: list[tuple[int, float]], timestamps: np.ndarray, default_ms: float) -> np.ndarray:
    """The interval (ms) in force at each time: the latest change at or before it; before the first change,
    the first one's (the sampler started with it)."""
    ts = np.asarray(timestamps, dtype=np.int64)
    if not changes:
        return np.full(ts.shape, float(default_ms))
    starts = np.array([c[0] for c in changes], dtype=np.int64)
    values = np.array([c[1] for c in changes], dtype=np.float64)
    return values[np.clip(np.searchsorted(starts, ts, side="right") - 1, 0, None)]



def node_frame(node: str, table: pa.Table, info: dict[str, Any] | None = None) -> NodeFrame:
    """A `Run.system_wide()` table as a NodeFrame (float32 arrays as stored, NaN where missing),
    time-ordered. float32 keeps a node-day at 100 ms with 16 cores and 8 GPUs well under 1 GB. Columns
    already in time order are not copied again; each goes from Arrow to numpy once, and its Arrow data is let
    go as soon as it is converted (when the caller keeps no reference to `table`)."""
    if table.num_rows == 0 or TIMESTAMP not in table.column_names:
        return NodeFrame(node, np.empty(0, np.int64), {}, dict(info or {}))
    ts = table[TIMESTAMP].to_numpy(zero_copy_only=False).astype(np.int64)
    order = None if bool((ts[1:] >= ts[:-1]).all()) else np.argsort(ts, kind="stable")
    cols = {}
    for name in [n for n in table.column_names if n != TIMESTAMP]:
        values = table[name].to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        cols[name] = values if order is None else values[order]
        table = table.drop_columns([name])
    return NodeFrame(node, ts if order is None else ts[order], cols, dict(info or {}))
