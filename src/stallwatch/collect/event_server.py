"""The sampler's side of framework events: a Unix socket in a private directory that the job's processes
connect to (one connection per process, introduced by its rank); events and artifact notices come out
with who sent them, and the live configuration goes back to every process, with acknowledgements of what
was journaled to those that ask for them (see `acks`)."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from stallwatch.collect.acks import ACK_EVERY_LINES, ACK_INTERVAL_S, StreamMarks, stream_of
from stallwatch.collect.events import decode_batch, decode_line
from stallwatch.collect.stacks import StackDump
from stallwatch.log import warn_once
from stallwatch.records import LOSS, FrameworkEvent

MAX_LINE_BYTES = 1 << 20  # a connection that sends a longer line is broken or hostile: it is dropped
MAX_OUTBOX_BYTES = 4 << 20  # what waits to be sent to one job process; past it, a message is not sent (said)


@dataclass
class _Connection:
    sock: socket.socket | None  # None: lines replayed from a file (`replay`), nothing to send back
    buf: bytes = b""
    identity: dict[str, int] | None = None
    events: int = field(default=0)
    stream: int | None = None  # a sender that asks for acknowledgements: its stream...
    seq: int = 0  # ...and the number of its next line on this connection
    acked: int = 0  # what it was last told it may forget (every line before)
    acked_at: float = 0.0
    gone: bool = False  # the sender closed its end: nothing more is sent to it, what it sent is still read
    flushed: bool = True  # it answered the last flush request (everything it had before it is in)
    out: bytes = b""  # what is still to be sent to it (the rest of a line its socket had no room for)


class EventServer:
    """Non-blocking; the sampler's select loop waits on `fds()` and hands the ready ones to `receive()`."""

    def __init__(self, address: str) -> None:
        """`address`: a socket path in a directory only this user can enter (the launcher makes it)."""
        self.address = address
        try:
            os.unlink(address)  # left by a sampler that was killed; this one takes over
        except FileNotFoundError:
            pass
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.address)
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._conns: dict[int, _Connection] = {}
        self.identities: list[dict[str, int]] = []
        self.marks = StreamMarks()
        self._greeting: bytes | None = None  # sent to every process once it has introduced itself

    def broadcast(self, message: dict[str, Any], *, greet_new: bool = True) -> None:
        """Send `message` to every connected process (and, with `greet_new`, to each one that connects
        later). A process that cannot take it right now misses it: never block the sampler."""
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        if greet_new:
            self._greeting = line
        for fd, conn in list(self._conns.items()):
            if conn.identity is not None:
                self._send(fd, conn, line)

    def request_flush(self, number: int) -> None:
        """Ask every process to send what it has now (and each event as it comes from then on): a signal that
        kills at its default is about to reach the job. `flush_pending()` counts those yet to answer."""
        for conn in self._conns.values():
            conn.flushed = conn.identity is None or conn.gone or conn.sock is None
        self.broadcast({"flush": number}, greet_new=False)

    def flush_pending(self) -> int:
        return sum(1 for c in self._conns.values() if not c.flushed and not c.gone and c.sock is not None)

    def _send(self, fd: int, conn: _Connection, line: bytes) -> bool:
        """Queue `line` for the process and send what its socket takes now; the rest goes out at the next
        `push()` (every receive and acknowledgement round), never blocking the sampler and never cutting a line.
        False when it cannot be sent: the process is gone, or has not read the last 4 MB sent to it (said)."""
        if conn.gone or conn.sock is None:
            return False
        if len(conn.out) + len(line) > MAX_OUTBOX_BYTES:
            warn_once("events-broadcast-full", "a job process has not read its last %d bytes of stallwatch messages; "
                      "it misses one of %d bytes", len(conn.out), len(line))
            return False
        conn.out += line
        self._push(conn)
        return True

    def _push(self, conn: _Connection) -> None:
        while conn.out and not conn.gone and conn.sock is not None:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                conn.gone, conn.out = True, b""  # its last lines may still be unread here: dropped at end-of-file
                return
            conn.out = conn.out[sent:]

    def push(self) -> None:
        """Send the rest of what waits for each process (a message larger than its socket's room)."""
        for conn in self._conns.values():
            if conn.out:
                self._push(conn)

    def unsent_bytes(self) -> int:
        return sum(len(c.out) for c in self._conns.values() if not c.gone)

    def fds(self) -> list[int]:
        return [self._listener.fileno(), *self._conns]

    def receive(self, ready: list[int]) -> list[tuple[dict[str, int], FrameworkEvent | dict[str, Any]]]:
        """Accept new connections and read what the ready ones sent: (sender identity, item) pairs, where an
        item is a FrameworkEvent or an artifact notice (a dict, see `collect.artifacts`)."""
        out: list[tuple[dict[str, int], FrameworkEvent | dict[str, Any]]] = []
        self.push()
        for fd in ready:
            if fd == self._listener.fileno():
                self._accept()
                continue
            conn = self._conns.get(fd)
            if conn is None or conn.sock is None:
                continue
            try:
                data = conn.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._drop(fd)
                continue
            conn.buf += data
            *lines, conn.buf = conn.buf.split(b"\n")
            if len(conn.buf) > MAX_LINE_BYTES:
                warn_once("events-long-line", "dropping a framework-event connection that sent an overlong line")
                self._drop(fd)
                continue
            for line in lines:
                self._line(fd, conn, line, out)
        return out

    def replay(self, data: bytes | Iterable[bytes]) -> list[tuple[dict[str, int], FrameworkEvent | dict[str, Any]]]:
        """Lines a sender staged at its exit (`events.stage_unacked`: a hello, then the lines it sent but was
        not told were journaled and those it never sent), read as one more connection: the same checks, and
        the lines this sampler (or the journal it replayed) already has are skipped. `data`: the bytes, or
        their lines (a file read line by line)."""
        conn = _Connection(sock=None, gone=True)
        out: list[tuple[dict[str, int], FrameworkEvent | dict[str, Any]]] = []
        for line in data.split(b"\n") if isinstance(data, bytes) else data:
            line = line.rstrip(b"\n")
            if len(line) > MAX_LINE_BYTES:
                warn_once("events-long-line", "dropping a framework-event connection that sent an overlong line")
                break
            self._line(-1, conn, line, out)
            if conn.identity is None:
                break  # no hello first: not a sender's lines
        return out

    def _line(self, fd: int, conn: _Connection, line: bytes, out: list) -> None:
        if not line.strip():
            return
        try:
            if conn.identity is None:
                hello = json.loads(line)["hello"]
                conn.identity = _identity(hello)
                if conn.identity not in self.identities:  # a sender that reconnects is still one sender
                    self.identities.append(conn.identity)
                self._start_stream(fd, conn, hello)
                if self._greeting is not None:
                    self._send(fd, conn, self._greeting)
                return
            if conn.stream is not None:
                conn.seq += 1
                if not self.marks.accept(conn.stream, conn.seq - 1):
                    return  # sent again after a reconnection, and had already
            value = decode_line(line)
            if isinstance(value, dict):
                if "lost" in value:
                    out.append((conn.identity, loss_event(value["lost"], conn.identity["pid"])))
                    return
                if "flushed" in value:
                    conn.flushed = True
                    return
                if isinstance(value.get("stacks"), dict):
                    out.append((conn.identity, StackDump(conn.identity, value["stacks"])))
                    return
                if isinstance(value.get("notice"), dict):  # what the job did with a profiling window
                    out.append((conn.identity, {"notice": value["notice"]}))
                    return
                artifact = value.get("artifact")
                if not isinstance(artifact, dict):
                    raise ValueError("unknown message")
                out.append((conn.identity, artifact))
                return
            events = decode_batch(value)
            out.extend((conn.identity, e) for e in events)
            conn.events += len(events)
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            warn_once(f"events-bad-{type(exc).__name__}", "ignoring a malformed framework event (%s)",
                      str(exc)[:200])

    def _start_stream(self, fd: int, conn: _Connection, hello: dict) -> None:
        """A sender that numbers its lines: told at once what this sampler already has of its stream (which
        also tells it that this sampler acknowledges)."""
        stream = stream_of(hello)
        if stream is None:
            return
        conn.stream, conn.seq = stream
        conn.acked = max(conn.seq, self.marks.durable.get(conn.stream, 0))
        conn.acked_at = time.monotonic()
        self._ack(fd, conn, conn.acked)

    def acknowledge(self, *, now: float | None = None) -> None:
        """Tell each sender what it may forget, where that moved by `ACK_EVERY_LINES` lines or some did
        `ACK_INTERVAL_S` ago: cheap, never per line."""
        now = time.monotonic() if now is None else now
        self.push()
        for fd, conn in list(self._conns.items()):
            if conn.stream is None or conn.gone:
                continue
            durable = self.marks.durable.get(conn.stream, 0)
            if durable > conn.acked and (durable - conn.acked >= ACK_EVERY_LINES
                                         or now - conn.acked_at >= ACK_INTERVAL_S):
                if self._ack(fd, conn, durable):
                    conn.acked, conn.acked_at = durable, now

    def _ack(self, fd: int, conn: _Connection, upto: int) -> bool:
        if conn.gone or conn.sock is None or conn.out:
            return False  # not reading now (or a message is still going out whole): a later one says it
        return self._send(fd, conn, b'{"ack":%d}\n' % upto)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                warn_once("events-accept", "cannot accept a framework-event connection (%s)", exc)
                return
            sock.setblocking(False)
            self._conns[sock.fileno()] = _Connection(sock)

    def _drop(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        if conn is not None and conn.sock is not None:
            conn.sock.close()

    def close(self) -> None:
        for fd in list(self._conns):
            self._drop(fd)
        self._listener.close()
        try:
            os.unlink(self.address)
        except OSError:
            pass


def loss_event(lost: object, pid: int) -> FrameworkEvent:
    """A sender's `{"lost": {events, steps, first_us, last_us}}` as the `loss` event recorded for its rank."""
    if not isinstance(lost, dict):
        raise ValueError("lost: an object of events, steps, first_us and last_us")
    values = {}
    for key in ("events", "steps", "first_us", "last_us"):
        value = lost.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
            raise ValueError(f"lost: {key} must be a non-negative integer")
        values[key] = value
    first, last = sorted((values["first_us"], values["last_us"]))
    return FrameworkEvent(LOSS, "events_dropped", first, last, "GLOBAL", None, pid,
                          json.dumps({"events": values["events"], "steps": values["steps"]}))


_IDENTITY = (("rank", 0), ("local_rank", 0), ("world_size", 1), ("pid", 0))
_MAX_ID = 2**31 - 1  # ranks and pids are stored as int32


def _identity(hello: object) -> dict[str, int]:
    """A process's introduction: rank, local_rank, world_size and pid, each an integer that fits the store."""
    if not isinstance(hello, dict):
        raise ValueError("a hello is an object of rank, local_rank, world_size and pid")
    out = {}
    for key, low in _IDENTITY:
        value = hello[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_ID:
            raise ValueError(f"hello: {key} must be an integer from {low} to {_MAX_ID}")
        out[key] = value
    return out
