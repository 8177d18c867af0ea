"""The sampler's write-ahead journal of framework events: what it received but has not yet stored in the
run is appended to a local file in the private directory that outlives it, so a sampler killed mid-run
loses nothing it had received; the launcher's next sampler replays the journal before anything else."""

from __future__ import annotations

import marshal
import os
import struct

from stallwatch.collect.events import decode_batch
from stallwatch.log import logger, warn_once
from stallwatch.records import FrameworkEvent

MAX_JOURNAL_BYTES = 256 << 20  # past this (the run cannot be written for long) the journal stops growing
_HEADER = struct.Struct("<I")


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

    def append(self, rank: int, events: list[FrameworkEvent]) -> None:
        if self._fd is None or not events:
            return
        if self.bytes >= MAX_JOURNAL_BYTES:
            warn_once("journal-full", "the framework-event journal reached %d MB; events are no longer "
                      "journaled until they are stored", MAX_JOURNAL_BYTES >> 20)
            return
        data = marshal.dumps((rank, [(e.kind, e.name, e.start_us, e.end_us, e.mode, e.step, e.pid, e.args)
                                     for e in events]))
        try:
            self.bytes += os.write(self._fd, _HEADER.pack(len(data)) + data)
        except OSError as exc:
            warn_once("journal-write", "cannot journal framework events (%s)", exc.strerror or exc)

    def clear(self) -> None:
        """Everything journaled is stored in the run now."""
        if self._fd is None or self.bytes == 0:
            return
        try:
            os.ftruncate(self._fd, 0)
            self.bytes = 0
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


def replay(path: str) -> list[tuple[int, list[FrameworkEvent]]]:
    """The records a previous sampler journaled, each checked like events from the socket; a record cut
    short by the kill (the last one) and anything unreadable after it are skipped."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_JOURNAL_BYTES + (1 << 20))
    except FileNotFoundError:
        return []
    except OSError as exc:
        logger.warning("cannot read the framework-event journal %s (%s)", path, exc.strerror or exc)
        return []
    out: list[tuple[int, list[FrameworkEvent]]] = []
    at = 0
    while at + _HEADER.size <= len(data):
        (size,) = _HEADER.unpack_from(data, at)
        body = data[at + _HEADER.size:at + _HEADER.size + size]
        if len(body) < size:
            break
        at += _HEADER.size + size
        try:
            rank, events = marshal.loads(body)
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 2**31:
                raise ValueError("bad rank")
            out.append((rank, decode_batch(list(events))))
        except (EOFError, ValueError, TypeError) as exc:
            warn_once("journal-bad", "skipping the rest of an unreadable framework-event journal (%s)", exc)
            break
    return out
