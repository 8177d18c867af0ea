"""A stream's rollups written as segments are compacted: one file per aligned block of time (6 h of system
rollups, a day of framework ones), rewritten under a new name as each segment adds to it, so a day of a node is a
handful of files. Never raises: rollups can always be rebuilt from the segments (readers do). They count in the
node's storage cap, and give their room back to data when the cap is reached (`StorageBudget.reclaim`)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyarrow as pa

from stallwatch.log import warn_once
from stallwatch.store import layout
from stallwatch.store.chunk_writer import Sink, StorageBudget
from stallwatch.store.rollup_codec import encode

H = 3600 * 1_000_000
SYSTEM_BLOCK_US = 6 * H
FRAMEWORK_BLOCK_US = 24 * H


class RollupBlocks:
    """Not thread-safe: the stream's writer is its only caller. A file's name spans the samples it is responsible
    for: from the earliest sample of its segments (or its block's start) to the latest (its block's end once the
    stream has moved past it), so readers know which segments it covers; the span only grows, as segments whose
    events came out of order must stay covered, and new content always takes a new name."""

    def __init__(self, sink: Sink, directory: str, block_us: int,
                 combine: Callable[[list[pa.Table]], pa.Table], budget: StorageBudget | None = None) -> None:
        self._sink = sink
        self._budget = budget
        self._files: dict[str, int] = {}  # written and not deleted: name -> bytes (counted in the budget)
        self._off = False  # past the storage cap: no more rollups (readers rebuild them)
        if budget is not None:
            budget.reclaimable(self._reclaim)
        self._dir = directory
        self._block_us = block_us
        self._combine = combine
        self._block: int | None = None
        self._rows: pa.Table | None = None
        self._start = 0
        self._end = 0
        self._written: str | None = None
        self._dirty = False  # rows or span changed since the block's file was last written

    def add(self, rows: pa.Table, first_us: int, last_us: int) -> None:
        """A compacted segment's rollup rows (`bucket_us` aligned to a divisor of the block) and sample span."""
        if self._off:
            return
        try:
            blocks = rows["bucket_us"].to_numpy() // self._block_us
            for block in np.unique(blocks):
                part = rows.filter(pa.array(blocks == block))
                block_start = int(block) * self._block_us
                if self._block is not None and block != self._block:
                    block_end = self._block * self._block_us + self._block_us - 1
                    self._dirty |= self._end != block_end  # the stream moved past it: it covers the block's end
                    self._end = block_end
                    self._write()
                    self._block, self._rows, self._written = None, None, None
                start, end = max(first_us, block_start), min(last_us, block_start + self._block_us - 1)
                if self._block is None:
                    self._block, self._rows = int(block), part
                    self._start, self._end = start, end
                else:  # a segment's span may begin before, or end after, the block's earlier ones (events come
                    # in the order they end: a long first step's record after its phases' segment was written)
                    assert self._rows is not None
                    self._rows = self._combine([self._rows, part])
                    self._start, self._end = min(self._start, start), max(self._end, end)
                self._dirty = True
            self._write()
        except Exception as exc:
            warn_once(f"rollup-{self._dir}", "cannot update the rollups of %s (%s: %s); readers rebuild them",
                      self._dir, type(exc).__name__, exc)

    def _write(self) -> None:
        if self._rows is None or self._off or not self._dirty:
            return
        name = f"{self._dir}/{layout.rollup_name(self._start, self._end)}"
        if name == self._written:  # new rows within the span already named: readers keep a file by its name
            self._end += 1  # (names are immutable), so the new content takes a new one
            name = f"{self._dir}/{layout.rollup_name(self._start, self._end)}"
        data = encode(self._rows)
        replaces = self._files.get(self._written, 0) if self._written is not None else 0
        if self._budget is not None and not self._budget.fits(len(data) - replaces):
            warn_once(f"rollup-cap-{self._dir}", "storage cap reached: no more rollups of %s (readers rebuild them "
                      "from the data)", self._dir)
            self._reclaim()
            return
        self._sink.write_atomic(name, data)
        self._files[name] = len(data)
        if self._budget is not None:
            self._budget.add(len(data))
        previous, self._written = self._written, name
        self._dirty = False
        if previous is not None:
            self._delete(previous)

    def _delete(self, name: str) -> None:
        try:
            self._sink.delete(name)
        except Exception:  # a leftover with the same start and an earlier end is skipped by readers
            return
        size = self._files.pop(name, 0)
        if self._budget is not None:
            self._budget.add(-size)

    def _reclaim(self) -> int:
        """Delete every rollup this stream wrote and write no more: their room goes to data. Bytes freed."""
        self._off = True
        before = sum(self._files.values())
        for name in list(self._files):
            self._delete(name)
        self._rows, self._written = None, None
        return before - sum(self._files.values())


class LeftoverRollups:
    """A resumed node's rollups, left by its earlier sampler: counted in the storage cap like this sampler's own,
    and deleted when data needs the room (readers rebuild them from the data)."""

    def __init__(self, sink: Sink, files: dict[str, int]) -> None:
        self._sink = sink
        self._files = dict(files)  # path in the run -> bytes
        self._budget: StorageBudget | None = None

    @classmethod
    def of_node(cls, location: Any, node: str) -> LeftoverRollups:
        """The node's rollup files in a local run (a remote run's are not listed: none counted)."""
        if location.remote:
            return cls(location, {})
        tops = (layout.system_rollup_dir(node), f"{layout.ROLLUPS_DIR}/{layout.FRAMEWORK_DIR}/{node}")
        return cls(location, {e.path: e.size for top in tops for e in location.list(top)})

    @property
    def bytes(self) -> int:
        return sum(self._files.values())

    def count_in(self, budget: StorageBudget) -> None:
        """`budget.used` already holds `bytes`; from now on they are given back when data needs the room."""
        self._budget = budget
        if self._files:
            budget.reclaimable(self._reclaim)

    def _reclaim(self) -> int:
        freed = 0
        for name, size in list(self._files.items()):
            try:
                self._sink.delete(name)
            except Exception:  # still on disk, still counted
                continue
            del self._files[name]
            if self._budget is not None:
                self._budget.add(-size)
            freed += size
        return freed

