"""Buffers a node's snapshots and writes them as atomic Parquet parts (every flush) and segments (every
rotation), within a storage cap and with bounded memory; write failures degrade, they never raise."""

from __future__ import annotations


from typing import Protocol

import numpy as np

from stallwatch.log import logger, warn_once
from stallwatch.records import MetricKey
from stallwatch.store import layout
from stallwatch.store.system_codec import encode

SEGMENT_US = 600 * 1_000_000  # one compacted file per 10 minutes of samples


class Sink(Protocol):
    def write_atomic(self, rel: str, data: bytes) -> None: ...
    def delete(self, rel: str) -> None: ...


class SystemWriter:
    """Not thread-safe: the sampler loop is its only caller."""

    def __init__(self, sink: Sink, node: str, keys: list[MetricKey], *, interval_us: int, flush_interval_us: int,
                 max_bytes: int, stored_bytes: int = 0, segment_us: int = SEGMENT_US) -> None:
        self._sink = sink
        self._dir = layout.system_dir(node)
        self.keys = list(keys)
        self._flush_us = flush_interval_us
        self._segment_us = max(segment_us, flush_interval_us)
        self._max_bytes = max_bytes
        self.stored_bytes = stored_bytes
        # Room for one segment plus slack for late rotation; beyond it the segment is rotated early.
        self._capacity = int(self._segment_us / max(interval_us, 1)) + 64
        self._ts = np.zeros(self._capacity, dtype=np.int64)
        self._values = np.full((self._capacity, len(self.keys)), np.nan, dtype=np.float64)
        self._n = 0  # rows in the current segment
        self._flushed = 0  # rows of the segment already in parts
        self._parts: list[tuple[str, int]] = []  # (path, size) of this segment's parts
        self._last_flush_us: int | None = None
        self.samples_written = 0
        self.samples_dropped = 0
        self._cap_hit = False
        self._failing = False

    @property
    def pending(self) -> int:
        return self._n - self._flushed

    def append(self, timestamp_us: int, values: list[float]) -> None:
        if self._n == self._capacity:
            self.rotate()
            if self._n == self._capacity:  # rotation could not write: drop the oldest data, keep memory bounded
                self._drop_segment("the buffer is full")
        self._ts[self._n] = timestamp_us
        self._values[self._n, :] = values
        self._n += 1
        if self._last_flush_us is None:
            self._last_flush_us = timestamp_us

    def tick(self, now_us: int) -> None:
        """Flush or rotate when due; called by the sampler after each snapshot."""
        if self._n and now_us - int(self._ts[0]) >= self._segment_us:
            self.rotate()
        elif self._last_flush_us is not None and now_us - self._last_flush_us >= self._flush_us:
            self.flush()

    def flush(self) -> None:
        """Write the rows not yet in a part as one new part file."""
        self._last_flush_us = int(self._ts[self._n - 1]) if self._n else self._last_flush_us
        if self.pending == 0:
            return
        lo, hi = self._flushed, self._n
        name = self._name(layout.PART, lo, hi)
        data = encode(layout.PART, self.keys, self._ts[lo:hi], self._values[lo:hi])
        if self._write(name, data, replaces=0):
            self._parts.append((name, len(data)))
            self.samples_written += hi - lo
            self._flushed = hi

    def rotate(self) -> None:
        """Write the whole segment as one compact file, then delete its parts."""
        if self._n == 0:
            return
        name = self._name(layout.SEGMENT, 0, self._n)
        data = encode(layout.SEGMENT, self.keys, self._ts[: self._n], self._values[: self._n])
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
            except Exception as exc:  # a leftover part is harmless: readers skip parts covered by a segment
                warn_once("part-delete", "could not delete compacted part %s (%s); readers skip it", path, exc)
        self.samples_written += self._n - self._flushed
        self._last_flush_us = int(self._ts[self._n - 1])  # the segment holds everything: no flush is due now
        self._reset()

    def close(self) -> None:
        """Final rotation: on a normal exit every sample ends in a segment."""
        self.rotate()
        if self._n:
            self.flush()
        if self._n - self._flushed:
            self._drop_segment("it could not be written at exit")

    def _name(self, kind: str, lo: int, hi: int) -> str:
        # min/max, not first/last: after a wall-clock step back, a file's name must still cover all its samples
        ts = self._ts[lo:hi]
        return f"{self._dir}/{layout.chunk_name(kind, int(ts.min()), int(ts.max()))}"

    def _reset(self) -> None:
        self._n = 0
        self._flushed = 0
        self._parts = []
        self._values.fill(np.nan)

    def _drop_segment(self, why: str) -> None:
        lost = self._n - self._flushed
        self.samples_dropped += lost
        if lost and not self._cap_hit:  # past the storage cap, dropping is what its one warning announced
            logger.warning("dropped %d system snapshots because %s", lost, why)
        self._reset()

    def _write(self, name: str, data: bytes, replaces: int) -> bool:
        if self.stored_bytes - replaces + len(data) > self._max_bytes:
            if not self._cap_hit:
                self._cap_hit = True
                logger.warning("storage cap of %.0f MB reached (%s); new system samples are not stored. "
                               "Raise max_storage_mb to keep more.", self._max_bytes / 2**20, self._dir)
            return False
        try:
            self._sink.write_atomic(name, data)
        except Exception as exc:
            if not self._failing:
                self._failing = True
                logger.warning("cannot write %s (%s); samples stay in memory (bounded) and are retried",
                               name, _describe(exc))
            return False
        if self._failing:
            self._failing = False
            logger.warning("writing system samples works again (%s)", name)
        self.stored_bytes += len(data)
        return True


def _describe(exc: BaseException) -> str:
    strerror = getattr(exc, "strerror", None)
    return strerror or f"{type(exc).__name__}: {exc}"
