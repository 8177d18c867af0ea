"""A node's system snapshots, buffered as one numeric block and written through ChunkWriter."""

from __future__ import annotations

import numpy as np

from stallwatch.records import MetricKey
from stallwatch.store import layout
from stallwatch.store.chunk_writer import SEGMENT_US, ChunkWriter, Sink, StorageBudget
from stallwatch.store.rollup_codec import combine_system, system_rows
from stallwatch.store.rollup_writer import SYSTEM_BLOCK_US, RollupBlocks
from stallwatch.store.system_codec import PartEncoder, encode

__all__ = ["SEGMENT_US", "Sink", "SystemWriter"]


class SystemWriter(ChunkWriter):
    """Not thread-safe: the sampler loop is its only caller."""

    what = "system snapshots"

    def __init__(self, sink: Sink, node: str, keys: list[MetricKey], *, interval_us: int, flush_interval_us: int,
                 max_bytes: int, stored_bytes: int = 0, segment_us: int = SEGMENT_US,
                 budget: StorageBudget | None = None) -> None:
        segment_us = max(segment_us, flush_interval_us)
        capacity = _capacity(segment_us, interval_us)
        super().__init__(sink, layout.system_dir(node), capacity=capacity,
                         flush_interval_us=max(flush_interval_us, interval_us), max_bytes=max_bytes,
                         stored_bytes=stored_bytes, segment_us=segment_us, budget=budget)
        self._flush_asked_us = flush_interval_us
        self.keys = list(keys)
        self._parts_encoder = PartEncoder(self.keys)
        self._ts = np.zeros(capacity, dtype=np.int64)
        self._values = np.full((capacity, len(self.keys)), np.nan, dtype=np.float64)
        self._rollups = RollupBlocks(sink, layout.system_rollup_dir(node), SYSTEM_BLOCK_US, combine_system,
                                     budget=self._budget)

    def set_interval(self, interval_us: int) -> None:
        """A live change of the sampling interval: the buffer grows to hold a segment at the new pace (it never
        shrinks: memory stays bounded by the finest interval used), and a flush carries at least one snapshot."""
        capacity = _capacity(self._segment_us, interval_us)
        if capacity > self._capacity:
            ts = np.zeros(capacity, dtype=np.int64)
            values = np.full((capacity, len(self.keys)), np.nan, dtype=np.float64)
            ts[:self._n], values[:self._n] = self._ts[:self._n], self._values[:self._n]
            self._ts, self._values, self._capacity = ts, values, capacity
        self._flush_us = max(self._flush_asked_us, interval_us)

    def append(self, timestamp_us: int, values: list[float]) -> None:
        self._make_room()
        self._ts[self._n] = timestamp_us
        self._values[self._n, :] = values
        self._added(timestamp_us)

    def _encode(self, kind: str, lo: int, hi: int) -> bytes:
        if kind == layout.PART:
            return self._parts_encoder.encode(self._ts[lo:hi], self._values[lo:hi])
        return encode(kind, self.keys, self._ts[lo:hi], self._values[lo:hi])

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        # min/max, not first/last: after a wall-clock step back, a file's name must still cover all its samples
        ts = self._ts[lo:hi]
        return int(ts.min()), int(ts.max())

    def _compacted(self, lo: int, hi: int) -> None:
        rows = system_rows(self._ts[lo:hi], self._values[lo:hi], [k.column for k in self.keys])
        self._rollups.add(rows, *self._span(lo, hi))

    def _first_us(self) -> int:
        return int(self._ts[0])

    def _clear(self) -> None:
        self._values.fill(np.nan)


def _capacity(segment_us: int, interval_us: int) -> int:
    """Room for one segment plus slack for late rotation; beyond it the segment is rotated early."""
    return int(segment_us / max(interval_us, 1)) + 64
