"""One rank's framework events, buffered as columns and written through ChunkWriter."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from stallwatch.records import FrameworkEvent
from stallwatch.store import layout
from stallwatch.store.chunk_writer import SEGMENT_US, ChunkWriter, Sink, StorageBudget
from stallwatch.store.framework_codec import STORED_SCHEMA, encode
from stallwatch.store.rollup_codec import combine_framework, framework_rows
from stallwatch.store.rollup_writer import FRAMEWORK_BLOCK_US, RollupBlocks

# Events held for one segment at most; a loop of very short steps rotates early instead of growing.
MAX_BUFFERED_EVENTS = 200_000
_COLUMNS = ("pid", "kind", "name", "mode", "step", "start_us", "end_us", "args")


class FrameworkWriter(ChunkWriter):
    """Not thread-safe: one loop is its only caller."""

    what = "framework events"

    def __init__(self, sink: Sink, node: str, rank: int | str, *, flush_interval_us: int, max_bytes: int,
                 stored_bytes: int = 0, segment_us: int = SEGMENT_US, capacity: int = MAX_BUFFERED_EVENTS,
                 budget: StorageBudget | None = None) -> None:
        super().__init__(sink, layout.framework_dir(node, rank), capacity=capacity,
                         flush_interval_us=flush_interval_us, max_bytes=max_bytes, stored_bytes=stored_bytes,
                         segment_us=segment_us, budget=budget)
        self._cols: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
        self._rollups = RollupBlocks(sink, layout.framework_rollup_dir(node, rank), FRAMEWORK_BLOCK_US,
                                     combine_framework, budget=self._budget)

    def append(self, event: FrameworkEvent) -> None:
        self._make_room()
        for c in _COLUMNS:
            self._cols[c].append(getattr(event, c))
        self._added(event.start_us)

    def _encode(self, kind: str, lo: int, hi: int) -> bytes:
        return encode(kind, {c: v[lo:hi] for c, v in self._cols.items()})

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        # From the earliest start to the latest end: a time-range read must find every event it overlaps.
        return min(self._cols["start_us"][lo:hi]), max(self._cols["end_us"][lo:hi])

    def _compacted(self, lo: int, hi: int) -> None:
        try:
            events = pa.table({c: pa.array(self._cols[c][lo:hi], STORED_SCHEMA.field(c).type)
                               for c in ("kind", "name", "mode", "step", "start_us", "end_us", "args")})
        except Exception as exc:  # events the segment encoder took; never let a rollup stop compaction
            from stallwatch.log import warn_once

            warn_once("rollup-framework-events", "no framework rollups (%s: %s)", type(exc).__name__, exc)
            return
        self._rollups.add(framework_rows(events), *self._span(lo, hi))

    def _first_us(self) -> int:
        return self._cols["start_us"][0]

    def _clear(self) -> None:
        for v in self._cols.values():
            v.clear()
