"""Buffered rows of one stream (a node's system samples, a rank's framework events) written as atomic
parts (every flush) and segments (every rotation), within a storage cap and with bounded memory; write
failures degrade, they never raise. Subclasses own the buffer; this class owns the files."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol

from stallwatch.log import logger, warn_once
from stallwatch.store import layout

SEGMENT_US = 600 * 1_000_000  # one compacted file per 10 minutes of data


@dataclass
class StorageBudget:
    """Bytes a node may store (max_storage_mb), shared by all of its writers (the sampler loop's and the
    artifact thread's: changes go through `add`, under a lock)."""

    limit: int
    used: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # what can be given back for data: rollups, which readers rebuild from the data (each returns bytes freed)
    _reclaimers: list[Callable[[], int]] = field(default_factory=list, repr=False, compare=False)

    def add(self, delta: int) -> None:
        with self._lock:
            self.used += delta

    def fits(self, delta: int) -> bool:
        return self.used + delta <= self.limit

    def reclaimable(self, reclaim: Callable[[], int]) -> None:
        """Register bytes that may be deleted to make room for data (`reclaim()` deletes them, says how many)."""
        self._reclaimers.append(reclaim)

    def reclaim(self) -> int:
        """Delete everything reclaimable (once: reclaimers are dropped); bytes freed (already subtracted)."""
        reclaimers, self._reclaimers = self._reclaimers, []
        return sum(r() for r in reclaimers)


class Sink(Protocol):
    def write_atomic(self, rel: str, data: bytes) -> None: ...
    def delete(self, rel: str) -> None: ...


class ChunkWriter:
    """Not thread-safe: one loop is its only caller. Subclasses implement `_encode`, `_span`, `_first_us`
    and `_clear`, and call `_make_room()` before and `_added(ts)` after buffering a row."""

    what = "rows"  # for log lines: "system snapshots", "framework events"

    def __init__(self, sink: Sink, directory: str, *, capacity: int, flush_interval_us: int, max_bytes: int,
                 stored_bytes: int = 0, segment_us: int = SEGMENT_US, budget: StorageBudget | None = None) -> None:
        self._sink = sink
        self._dir = directory
        self._capacity = capacity
        self._flush_us = flush_interval_us
        self._segment_us = max(segment_us, flush_interval_us)
        self._budget = budget if budget is not None else StorageBudget(max_bytes, stored_bytes)
        self.stored_bytes = stored_bytes  # this writer's own files
        self._n = 0  # rows in the current segment
        self._flushed = 0  # rows of the segment already in parts
        self._parts: list[tuple[str, int]] = []  # (path, size) of this segment's parts
        self._last_flush_us: int | None = None
        self.samples_written = 0
        self.samples_dropped = 0
        self._cap_hit = False
        self._failing = False

    # -- what subclasses provide ------------------------------------------------------------------------
    def _encode(self, kind: str, lo: int, hi: int) -> bytes:
        raise NotImplementedError

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        """Earliest and latest time in rows [lo, hi): the file's name must cover all of them."""
        raise NotImplementedError

    def _first_us(self) -> int:
        """Time of the segment's first row (rotation is due a segment length after it)."""
        raise NotImplementedError

    def _clear(self) -> None:
        raise NotImplementedError

    def _compacted(self, lo: int, hi: int) -> None:
        """Rows [lo, hi) are now a segment: a subclass writes their rollups (nothing by default)."""

    # -- buffering --------------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return self._n - self._flushed

    def _make_room(self) -> None:
        if self._n == self._capacity:
            self.rotate()
            if self._n == self._capacity:  # rotation could not write: drop the oldest data, keep memory bounded
                self._drop_segment("the buffer is full")

    def _added(self, ts_us: int) -> None:
        self._n += 1
        if self._last_flush_us is None:
            self._last_flush_us = ts_us

    # -- files ------------------------------------------------------------------------------------------
    def tick(self, now_us: int) -> None:
        """Flush or rotate when due; called by the owning loop regularly."""
        if self._n and now_us - self._first_us() >= self._segment_us:
            self.rotate()
        elif self._last_flush_us is not None and now_us - self._last_flush_us >= self._flush_us:
            self.flush(now_us)

    def flush(self, now_us: int | None = None) -> None:
        """Write the rows not yet in a part as one new part file."""
        if now_us is not None:
            self._last_flush_us = now_us
        elif self._n:
            self._last_flush_us = self._span(self._n - 1, self._n)[1]
        if self.pending == 0:
            return
        lo, hi = self._flushed, self._n
        name = self._name(layout.PART, lo, hi)
        data = self._encode(layout.PART, lo, hi)
        if self._write(name, data, replaces=0):
            self._parts.append((name, len(data)))
            self.samples_written += hi - lo
            self._flushed = hi

    def rotate(self) -> None:
        """Write the whole segment as one compact file, then delete its parts."""
        if self._n == 0:
            return
        name = self._name(layout.SEGMENT, 0, self._n)
        data = self._encode(layout.SEGMENT, 0, self._n)
        parts_bytes = sum(size for _, size in self._parts)
        if not self._write(name, data, replaces=parts_bytes):
            if self._n - self._flushed == 0:
                # Everything is safe in parts already; start a new segment and keep the parts as they are.
                self._reset()
            return
        for path, size in self._parts:
            try:
                self._sink.delete(path)
                self.stored_bytes -= size
                self._budget.add(-size)
            except Exception as exc:  # a leftover part is harmless: readers skip parts covered by a segment
                warn_once("part-delete", "could not delete compacted part %s (%s); readers skip it", path, exc)
        self.samples_written += self._n - self._flushed
        try:
            self._compacted(0, self._n)
        except Exception as exc:  # rollups are derived data: readers rebuild them, the segment stands
            warn_once(f"rollup-{type(exc).__name__}", "no rollups for a compacted segment (%s: %s); readers rebuild "
                      "them", type(exc).__name__, exc)
        self._last_flush_us = self._span(self._n - 1, self._n)[1]  # the segment holds everything: no flush due
        self._reset()

    def close(self) -> None:
        """Final rotation: on a normal exit every row ends in a segment."""
        self.rotate()
        if self._n:
            self.flush()
        if self._n - self._flushed:
            self._drop_segment("it could not be written at exit")

    def _name(self, kind: str, lo: int, hi: int) -> str:
        first, last = self._span(lo, hi)
        return f"{self._dir}/{layout.chunk_name(kind, first, last)}"

    def _reset(self) -> None:
        self._n = 0
        self._flushed = 0
        self._parts = []
        self._clear()

    def _drop_segment(self, why: str) -> None:
        lost = self._n - self._flushed
        self.samples_dropped += lost
        if lost and not self._cap_hit:  # past the storage cap, dropping is what its one warning announced
            logger.warning("dropped %d %s because %s", lost, self.what, why)
        self._reset()

    def _write(self, name: str, data: bytes, replaces: int) -> bool:
        if not self._budget.fits(len(data) - replaces) and self._budget.reclaim():
            logger.info("storage cap: the rollups of %s were deleted to keep %s (readers rebuild them)",
                        self._dir, self.what)
        if not self._budget.fits(len(data) - replaces):
            if not self._cap_hit:
                self._cap_hit = True
                logger.warning("storage cap of %.0f MB reached (%s); new %s are not stored. "
                               "Raise max_storage_mb to keep more.", self._budget.limit / 2**20, self._dir, self.what)
            return False
        try:
            self._sink.write_atomic(name, data)
        except Exception as exc:
            if not self._failing:
                self._failing = True
                logger.warning("cannot write %s (%s); %s stay in memory (bounded) and are retried",
                               name, _describe(exc), self.what)
            return False
        if self._failing:
            self._failing = False
            logger.warning("writing %s works again (%s)", self.what, name)
        self.stored_bytes += len(data)
        self._budget.add(len(data))
        return True


def _describe(exc: BaseException) -> str:
    strerror = getattr(exc, "strerror", None)
    return strerror or f"{type(exc).__name__}: {exc}"
