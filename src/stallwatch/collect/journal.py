"""The sampler's write-ahead journal of framework events: what it received but has not yet stored in the
run is appended to a local file in the private directory that outlives it, so a sampler killed mid-run
loses nothing it had received; the launcher's next sampler replays the journal before anything else. Each
record also holds how far each sender's stream got (`acks`), in the same write, so that the next sampler
skips the lines a sender sends again that were journaled or stored already; clearing keeps those marks."""

from __future__ import annotations

import marshal
import os
import struct
from dataclasses import dataclass, field

from stallwatch.collect.events import decode_batch
from stallwatch.log import logger, warn_once
from stallwatch.records import FrameworkEvent

MAX_JOURNAL_BYTES = 256 << 20  # past this (the run cannot be written for long) the journal stops growing
_HEADER = struct.Struct("<I")


@dataclass
class Replayed:
    """What a previous sampler journaled: (rank, events) batches and each stream's next line."""

    batches: list[tuple[int, list[FrameworkEvent]]] = field(default_factory=list)
    marks: dict[int, int] = field(default_factory=dict)


class EventJournal:
    """Records of (rank, events) appended as they arrive, cleared once every writer has stored them. I/O
    failures turn journaling off with one line: the events are still written to the run as before."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.bytes = 0
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self.bytes = os.fstat(self._fd).st_size
        except OSError as exc:
            logger.warning("framework events are not journaled (%s): a killed sampler loses what it had not "
                           "stored yet", exc.strerror or exc)

    def append(self, batches: list[tuple[int, list[FrameworkEvent]]], marks: dict[int, int] | None = None) -> bool:
        """One record (one write: all of it or, cut by a kill, none): True once it is journaled."""
        if self._fd is None or not (batches or marks):
            return False
        if self.bytes >= MAX_JOURNAL_BYTES:
            warn_once("journal-full", "the framework-event journal reached %d MB; events are no longer "
                      "journaled until they are stored", MAX_JOURNAL_BYTES >> 20)
            return False
        record = _record(batches, marks or {})
        try:
            written = os.write(self._fd, record)
        except OSError as exc:
            warn_once("journal-write", "cannot journal framework events (%s)", exc.strerror or exc)
            return False
        if written == len(record):
            self.bytes += written
            return True
        # Cut short (a full disk): the piece is cut off again, so that the records after it still replay.
        warn_once("journal-write", "cannot journal framework events (wrote %d of %d bytes)", written, len(record))
        try:
            os.ftruncate(self._fd, self.bytes)
        except OSError as exc:
            warn_once("journal-truncate", "the framework-event journal could not be repaired (%s); it is "
                      "off from here", exc.strerror or exc)
            os.close(self._fd)
            self._fd = None
        return False

    def clear(self, marks: dict[int, int] | None = None) -> None:
        """Everything journaled is stored in the run now; `marks` (every stream's) are kept. The new journal
        replaces the old one whole (rename), so a kill in between never loses the marks."""
        if self._fd is None or (self.bytes == 0 and not marks):
            return
        tmp = self.path + ".new"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                written = os.write(fd, _record([], marks)) if marks else 0
                os.replace(tmp, self.path)
            except OSError:
                os.close(fd)
                raise
            os.close(self._fd)
            self._fd, self.bytes = fd, written
        except OSError as exc:
            warn_once("journal-clear", "cannot clear the framework-event journal (%s)", exc.strerror or exc)

    def close(self, *, remove: bool) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if remove:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _record(batches: list[tuple[int, list[FrameworkEvent]]], marks: dict[int, int]) -> bytes:
    data = marshal.dumps(([(rank, [(e.kind, e.name, e.start_us, e.end_us, e.mode, e.step, e.pid, e.args)
                                   for e in events]) for rank, events in batches], marks))
    return _HEADER.pack(len(data)) + data


def replay(path: str) -> Replayed:
    """The records a previous sampler journaled, each checked like events from the socket; a record cut
    short by the kill (the last one) and anything unreadable after it are skipped."""
    out = Replayed()
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_JOURNAL_BYTES + (1 << 20))
    except FileNotFoundError:
        return out
    except OSError as exc:
        logger.warning("cannot read the framework-event journal %s (%s)", path, exc.strerror or exc)
        return out
    at = 0
    while at + _HEADER.size <= len(data):
        (size,) = _HEADER.unpack_from(data, at)
        body = data[at + _HEADER.size:at + _HEADER.size + size]
        if len(body) < size:
            break
        at += _HEADER.size + size
        try:
            batches, marks = marshal.loads(body)
            for rank, events in batches:
                if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 2**31:
                    raise ValueError("bad rank")
                out.batches.append((rank, decode_batch(list(events))))
            for stream, seq in dict(marks).items():
                if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63 for v in (stream, seq)):
                    raise ValueError("bad stream mark")
                out.marks[stream] = max(seq, out.marks.get(stream, 0))
        except (EOFError, ValueError, TypeError) as exc:
            warn_once("journal-bad", "skipping the rest of an unreadable framework-event journal (%s)", exc)
            break
    return out
