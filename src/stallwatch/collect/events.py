"""The training process's side of framework events: hooks call `emit()`, which only appends to a bounded
queue; a background thread ships batches to the sampler process over a Unix socket, and reads what the
sampler sends back (live configuration). No I/O into the run ever happens in the training process, and
nothing here raises into it.

Lines on the socket, job to sampler: `{"hello": identity + stream, seq}` first, then JSON arrays (event
batches) and `{"artifact": {...}}` objects (profiler output staged locally, for the sampler to store) and
`{"lost": {...}}` (events this process had to drop, counted with their time span). Sampler to job:
`{"config": {...}}` (the run's live configuration, validated by the sampler), `{"ack": N}` (see `acks`) and
`{"stacks": N}` (answered with `{"stacks": {...}}`, every thread's Python stack: `collect.stacks`).

A stalled or restarting sampler costs nothing: a line that cannot be sent now stays queued (sends never
block), lines sent but not yet acknowledged are kept (bounded) and sent again to the next sampler, and the
queue drops only beyond its bound, counting what it dropped."""

from __future__ import annotations

import atexit
import base64
import binascii
import json
import marshal
import os
import select
import socket
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable

from stallwatch.collect import stacks  # imported now: a job stuck inside an import must still answer
from stallwatch.collect.acks import SentLine, Unacked, ack_of
from stallwatch.fds import above_standard
from stallwatch.log import warn_once
from stallwatch.records import FrameworkEvent

ENV_EVENTS = "STALLWATCH_EVENTS"  # the sampler's socket path, set by `stallwatch run` for the job
ENV_STAGING = "STALLWATCH_STAGING"  # a private local directory where the job stages profiler output
ENV_CONFIG = "STALLWATCH_CONFIG"  # the run's configuration (JSON) at start
ENV_ACKS = "STALLWATCH_EVENTS_ACKS"  # "1": the sampler acknowledges lines (known before it first answers)
SEND_INTERVAL_S = 0.2  # also what a job killed outright (SIGKILL, SIGTERM at its default) can lose
# Told `{"flush": N}` (`stallwatch run` is about to forward a SIGTERM that kills at its default), a sender sends
# what it has, answers `{"flushed": N}` after it, and from then on sends each event as it comes: the rank dies
# with nothing unsent (torchrun's ranks lost their last ~0.1 s).
RECONNECT_AFTER_S = 0.5  # the sampler may be restarting: try again after this long
CONNECT_GRACE_S = 15.0  # the job starts with its sampler: not reaching it this early is not worth a line
MAX_QUEUED_EVENTS = 100_000
# Events per line: encoding holds the GIL, so batches stay small enough (~50 µs) not to stall a step.
BATCH_EVENTS = 256
_FIELDS = ("kind", "name", "start_us", "end_us", "mode", "step", "pid", "args")
_STEP = "step"


def process_identity() -> dict[str, int]:
    """Rank, local rank and world size as torchrun (and most launchers) set them; 0/0/1 otherwise."""
    def num(name: str, default: int) -> int:
        try:
            value = int(os.environ.get(name, default))
        except ValueError:
            return default
        return value if 0 <= value < 2**31 else default  # the sampler takes int32 ranks only
    return {"rank": num("RANK", 0), "local_rank": num("LOCAL_RANK", 0), "world_size": num("WORLD_SIZE", 1),
            "pid": os.getpid()}


class EventSender:
    """Never blocks the caller, never raises into it; drops (counted, said once) only when the sampler stays
    out of reach longer than the queue's bound."""

    def __init__(self, address: str, identity: dict[str, int] | None = None,
                 max_queued: int = MAX_QUEUED_EVENTS,
                 on_message: Callable[[dict[str, Any]], None] | None = None) -> None:
        """`on_message` gets what the sampler sends (e.g. `{"config": {...}}`), on the sender's thread."""
        self.address = address
        self.identity = identity or process_identity()
        self.on_message = on_message
        self.on_tick: Callable[[], None] | None = None  # called on the sender's thread after each send
        self._queue: deque[tuple | dict] = deque()  # event tuples in _FIELDS order, or message dicts
        self._inbox = b""
        self._messages: list[dict[str, Any]] = []  # from the sampler, for `on_message`
        self._max = max_queued
        self.dropped = 0
        self.dropped_steps = 0
        self._dropped_span: list[int] = []  # [first start_us, last start_us] of what was dropped
        self._reported = (0, 0)  # (events, steps) already told to the sampler
        self.sent = 0
        self._sock: socket.socket | None = None
        self._stream = int.from_bytes(os.urandom(8), "little") >> 1  # this sender's lines, for the sampler
        self._unacked = Unacked()  # lines from the oldest the sampler has not acknowledged
        if os.environ.get(ENV_ACKS) == "1":
            # Known from the start, not from the first answer: a sampler stopped (then killed) before it
            # answers this process's hello must not make its lines look delivered.
            self._unacked.acks = True
        self._send_seq = 0  # the line being sent (or the next to send) on the current connection
        self._offset = 0  # bytes of that line already sent on the current connection
        self._held: dict | None = None  # a control message taken from the queue, to be its own next line
        self._fresh = 0  # lines before this one were sent once already (counted in `sent`)
        self._retry_at = 0.0  # while unreachable: no connection attempts before this (monotonic) time
        self._forked = False  # a copy inherited by a forked child: inert
        self._closed = False
        self._eager = False  # told to flush: every event wakes the thread (the process is about to be killed)
        self._born = time.monotonic()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one sender at a time (the thread, or close())
        self._thread = threading.Thread(target=self._run, name="stallwatch-events", daemon=True)
        self._thread.start()
        _senders.add(self)
        atexit.register(self.close)

    def emit(self, event: FrameworkEvent) -> None:
        self.emit_tuple((event.kind, event.name, event.start_us, event.end_us, event.mode, event.step, event.pid,
                         event.args))

    def emit_tuple(self, event: tuple) -> None:
        """Queue one event given as a tuple in `FrameworkEvent` field order: the hot path of the hooks
        (a deque append, no object built)."""
        if len(self._queue) >= self._max:
            self._drop(event)
            return
        self._queue.append(event)
        if self._eager:
            self._wake.set()

    def _drop(self, event: tuple) -> None:
        if self._forked:
            return
        self.dropped += 1
        if event[0] == _STEP:
            self.dropped_steps += 1
        t = event[2]
        if isinstance(t, int):
            span = self._dropped_span
            if span:
                span[0], span[1] = min(span[0], t), max(span[1], t)
            else:
                span[:] = [t, t]
        if self.dropped == 1:
            warn_once("events-dropped", "framework events are produced faster than they can be sent; "
                      "dropping some (counted, and recorded in the run)")

    def wake(self) -> None:
        """Send what is queued now, not at the next interval: for processes that may be killed any time
        (data-loader workers are terminated when the job exits)."""
        self._wake.set()

    def send_message(self, message: dict[str, Any]) -> None:
        """Queue a control message (e.g. `{"artifact": {...}}`); it keeps its place among the events."""
        if not self._forked:
            self._queue.append(message)

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (bounded by `timeout_s`) and disconnect; called at exit too."""
        if self._forked or (self._closed and not self._queue):
            return  # the exit hook after an explicit close has nothing left to do
        self._closed = True
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self._retry_at = 0.0  # a last chance now, whatever the back-off said
        self._send_queued(deadline=deadline)
        with self._lock:
            self._pull()  # the last acknowledgements, or the news that the sampler is gone
            if self._unacked.acks is True and self._stage_rest():
                return
            # Sent lines count as delivered while the connection stands; with it gone, the unacknowledged
            # ones (to a sampler that acknowledges) never were.
            gone = self._sock is None and self._unacked.acks is True
            lines = [line for line in self._unacked.lines if gone or line.seq >= self._send_seq]
            self._disconnect()
            unsent = [item for item in self._queue if not isinstance(item, dict)]
            self._queue, self._held = deque(), None
            self._unacked = Unacked()
            self._send_seq = self._unacked.next_seq
        for event in [*_events_of(lines), *unsent]:  # the process is ending: what was not sent is lost, counted
            self._drop(event)

    def _stage_rest(self) -> bool:
        """At exit, to a sampler that acknowledges (under the lock): every line it has not acknowledged, and the
        queue's events (with what was dropped, as a `lost` line) as lines after them, go to the staging folder,
        where the sampler that finishes the run (this one, or its successor after a death past its restarts)
        takes what it lacks. True when written: nothing is left to count as lost here."""
        while self._next_line() is not None:  # new lines, numbered after the unacknowledged ones
            pass
        if not stage_unacked(self.identity, self._stream, list(self._unacked.lines)):
            return False
        self._disconnect()
        self._queue, self._held = deque(), None
        self._unacked = Unacked()
        self._send_seq = self._unacked.next_seq
        return True

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's queue, connection and thread are the parent's. Sending them from
        here would repeat the parent's events (duplicate steps), so this copy goes inert."""
        self._forked = True
        self._stop.set()
        self._queue = deque()
        self._unacked, self._send_seq, self._held = Unacked(), 0, None
        self._max = 0
        self._lock = threading.Lock()
        if self._sock is not None:
            try:
                self._sock.close()  # the child's copy of the descriptor only; the parent's connection stays
            except OSError:
                pass
            self._sock = None

    def _run(self) -> None:
        # Connecting waits for the first event: a process that never records anything (torchrun's agent)
        # never shows up as a rank. The sampler greets each connection with its current configuration.
        while not self._stop.is_set():
            self._wake.wait(SEND_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._send_queued(deadline=None)
            self._receive()
            if self._eager and self._queue:
                self._send_queued(deadline=None)  # what a flush request queued: the answer after the events
            tick = self.on_tick
            if tick is not None:
                try:
                    tick()
                except Exception as exc:  # never kill the thread that sends the events
                    warn_once("events-tick", "stallwatch's timer failed (%s: %s)", type(exc).__name__, exc)

    def _send_queued(self, deadline: float | None) -> None:
        """Send lines until none is left, the socket is full (`deadline` None: try again at the next tick) or
        the sampler is out of reach; nothing taken from the queue is dropped on the way."""
        try:
            with self._lock:
                while True:
                    line = self._unacked.get(self._send_seq)
                    if line is None:
                        if self._unacked.full():
                            if self._unacked.acks:
                                # The sampler is behind acknowledging: events wait in the queue; at exit
                                # (a deadline), for its acknowledgements, as long as the deadline allows.
                                if not self._await_ack(deadline):
                                    return
                                continue
                            # a sampler that does not acknowledge: the line it has cannot be kept for it
                            self._unacked.release(self._send_seq)
                        line = self._next_line()
                        if line is None:
                            return
                    if not self._send_line(line.payload, deadline):
                        return
                    if line.seq >= self._fresh:
                        self.sent += line.events
                        self._fresh = line.seq + 1
                    self._send_seq, self._offset = line.seq + 1, 0
                    self._unacked.trim(self._send_seq)
        except Exception as exc:  # never into the training loop, never kill the thread silently
            warn_once("events-send", "sending framework events failed (%s: %s); they are dropped",
                      type(exc).__name__, exc)
            lost = self._unacked.release(self._unacked.next_seq)
            self._send_seq, self._offset = self._unacked.next_seq, 0
            for event in _events_of(lost):
                self._drop(event)

    def _await_ack(self, deadline: float | None) -> bool:
        """At exit only: wait (up to the deadline) for what the sampler says; True to go on sending."""
        wait = 0.0 if deadline is None else min(0.05, deadline - time.monotonic())
        if wait <= 0 or self._sock is None:
            return False
        select.select([self._sock], [], [], wait)
        self._pull()
        return True

    def _next_line(self) -> SentLine | None:
        """The next line to send: what was dropped since the last report, else a held control message, else a
        batch of queued events (up to a control message, which goes next, in its own line)."""
        if (self.dropped, self.dropped_steps) != self._reported and self._dropped_span:
            events, steps = self.dropped - self._reported[0], self.dropped_steps - self._reported[1]
            lost = {"lost": {"events": events, "steps": steps, "first_us": self._dropped_span[0],
                             "last_us": self._dropped_span[1]}}
            self._reported = (self.dropped, self.dropped_steps)
            self._dropped_span = []
            return self._unacked.add(_json_line(lost), 0)
        if self._held is not None:
            message, self._held = self._held, None
            return self._unacked.add(_json_line(message), 0)
        batch: list[tuple] = []
        while self._queue and len(batch) < BATCH_EVENTS:
            item = self._queue.popleft()
            if isinstance(item, dict):
                if not batch:
                    return self._unacked.add(_json_line(item), 0)
                self._held = item
                break
            batch.append(item)
        return self._unacked.add(encode_batch(batch), len(batch)) if batch else None

    def _send_line(self, payload: bytes, deadline: float | None) -> bool:
        """Send (the rest of) `payload`; True once all of it is out. A lost connection starts over on the next
        one from the oldest unacknowledged line: the sampler discards an unfinished line, and skips lines
        it already has, so nothing is written twice."""
        while self._offset < len(payload):
            if not self._connect():
                # At exit (a deadline) of a process that started moments ago: the sampler may still be
                # starting (a job that ends at once). Later, a sampler out of reach is not waited for.
                now = time.monotonic()
                if deadline is None or now + 0.05 > deadline or now - self._born > CONNECT_GRACE_S:
                    return False
                time.sleep(0.05)
                self._retry_at = 0.0
                continue
            assert self._sock is not None
            try:
                self._offset += self._sock.send(memoryview(payload)[self._offset:])
            except (BlockingIOError, InterruptedError):
                # The sampler is behind: wait for room, up to a send interval; a stopped sampler leaves the
                # line queued for the next attempt instead of blocking this thread (or the exit) for long.
                wait = SEND_INTERVAL_S if deadline is None else deadline - time.monotonic()
                if wait <= 0 or not select.select([], [self._sock], [], wait)[1]:
                    return False
            except OSError as exc:
                self._pull()  # acknowledgements it sent before it went
                self._lost_sampler(exc)
                return False
        return True

    def _receive(self) -> None:
        """Messages from the sampler: read without waiting; acknowledgements are taken here, each other
        complete line goes to `on_message`."""
        try:
            with self._lock:
                self._pull()
                messages, self._messages = self._messages, []
            for message in messages:
                if self.on_message is not None:
                    self.on_message(message)
        except Exception as exc:
            warn_once("events-receive", "a message from the stallwatch sampler could not be read (%s: %s)",
                      type(exc).__name__, exc)

    def _pull(self) -> None:
        """Read what the sampler sent (under the lock); a closed connection is a lost sampler."""
        if self._sock is None:
            return
        closed: OSError | None = None
        try:
            while True:
                data = self._sock.recv(1 << 16)
                if not data:
                    closed = ConnectionResetError("the sampler closed the connection")
                    break
                self._inbox += data
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            closed = exc
        *lines, self._inbox = self._inbox.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError as exc:
                warn_once("events-receive-line", "a message from the stallwatch sampler could not be read (%s)",
                          exc)
                continue
            if not isinstance(message, dict):
                continue
            upto = ack_of(message)
            if upto is not None:
                self._unacked.ack(upto, self._send_seq)
            elif "flush" in message:
                self._eager = True
                self._queue.append({"flushed": message["flush"]})  # after every event queued so far
            elif "stacks" in message:  # read here, on this thread: the training thread may be the one stuck
                self._queue.append({"stacks": _stacks(message["stacks"])})
            else:
                self._messages.append(message)
        if closed is not None:
            self._lost_sampler(closed)

    def _lost_sampler(self, exc: OSError) -> None:
        """The connection is gone: the next one starts from the oldest unacknowledged line (a sampler that
        does not acknowledge gets the line the loss cut, again)."""
        self._disconnect()
        self._offset = 0
        self._retry_at = time.monotonic() + RECONNECT_AFTER_S
        if self._unacked.acks:
            self._send_seq = self._unacked.first_seq()
        else:
            self._unacked.release(self._send_seq)
        warn_once("events-lost", "lost the stallwatch sampler (%s); framework events are kept and sent once it "
                  "is back", exc.strerror or exc)

    def _connect(self) -> bool:
        if self._sock is not None:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            sock = above_standard_fds(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            sock.settimeout(2.0)
            sock.connect(self.address)
            # `stream` and `seq` (the first line's number) ask for acknowledgements; a sampler that predates
            # them reads the identity and ignores them.
            sock.sendall(_json_line({"hello": {**self.identity, "stream": self._stream, "seq": self._send_seq}}))
            sock.setblocking(False)
            self._sock = sock
            self._inbox = b""
            self._offset = 0
            return True
        except OSError as exc:
            self._retry_at = time.monotonic() + RECONNECT_AFTER_S
            if time.monotonic() - self._born < CONNECT_GRACE_S and self.sent == 0:
                return False
            warn_once("events-connect", "cannot reach the stallwatch sampler at %s (%s); framework events "
                      "are kept (up to %d) until it answers", self.address, exc.strerror or exc, self._max)
            return False

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None


def _events_of(lines: list[SentLine] | deque[SentLine]) -> list[tuple]:
    """The event records in sent lines (to count them as lost)."""
    out: list[tuple] = []
    for line in lines:
        if line.events:
            out.extend(tuple(e) for e in decode_line(line.payload.rstrip(b"\n")))
    return out


UNACKED_PREFIX = "unacked-"  # staged lines a sender sent but was not told were journaled (see `stage_unacked`)


def stage_unacked(identity: dict[str, int], stream: int, lines: list[SentLine]) -> bool:
    """At exit: `lines` (contiguous, sent, unacknowledged) as the conversation that sent them — a hello
    naming their stream and first line, then the lines — in the staging folder, written whole (rename) or
    not at all. The sampler replays it at its end through the same checks and de-duplication as the socket."""
    folder = os.environ.get(ENV_STAGING)
    if not lines:
        return True
    if not folder:
        return False
    path = os.path.join(folder, f"{UNACKED_PREFIX}{stream}-{os.getpid()}.lines")
    hello = _json_line({"hello": {**identity, "stream": stream, "seq": lines[0].seq}})
    try:
        with open(path + ".tmp", "wb") as f:
            f.write(hello + b"".join(line.payload for line in lines))
        os.replace(path + ".tmp", path)
        return True
    except FileNotFoundError:
        return False  # the run's node has finished and its private folder is gone (a process that outlived the job)
    except OSError as exc:
        warn_once("events-stage-unacked", "cannot keep the last framework events for the sampler (%s)",
                  exc.strerror or exc)
        return False


def _stacks(request: Any) -> dict[str, Any]:
    return stacks.snapshot(request if isinstance(request, int) and not isinstance(request, bool) else 0)


def _json_line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def above_standard_fds(sock: socket.socket) -> socket.socket:
    """A job started with stdin, stdout or stderr closed must find them closed, not holding our socket:
    a socket that got descriptor 0, 1 or 2 moves above them (close-on-exec, like every socket)."""
    if sock.fileno() > 2:
        return sock
    return socket.socket(fileno=above_standard(sock.detach()))


def encode_batch(batch: list[tuple]) -> bytes:
    """One line: `M` + base64 of marshal's encoding of the event tuples. marshal is ~70x cheaper than JSON
    for this (the sender's encoding shares the GIL with the training thread); the socket is private to
    the user, and the receiver checks every value (`decode_batch`)."""
    return b"M" + base64.b64encode(marshal.dumps(batch)) + b"\n"


def decode_line(line: bytes) -> Any:
    """A sender's line: an event batch (`M...` marshal, or a JSON array) as a list, or a JSON message."""
    if line[:1] == b"M":
        try:
            return marshal.loads(base64.b64decode(line[1:], validate=True))
        except (EOFError, TypeError, binascii.Error) as exc:
            raise ValueError(f"undecodable event batch ({exc})") from None
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("a line nested too deeply") from None


def decode_batch(line: bytes | list) -> list[FrameworkEvent]:
    """An event batch (a line, or one decoded by `decode_line`): events `[kind, name, start_us, end_us,
    mode, step, pid, args]`, every value type-checked."""
    batch = decode_line(line) if isinstance(line, (bytes, str)) else line
    if not isinstance(batch, (list, tuple)):
        raise ValueError("not a batch of framework events")
    out = []
    for values in _expanded(batch):
        if not isinstance(values, (list, tuple)) or len(values) != len(_FIELDS):
            raise ValueError("not a framework event")
        kind, name, start, end, mode, step, pid, args = values
        # Checked here, not when a file is written: one bad event must not block a rank's writer.
        if not all(isinstance(v, str) for v in (kind, name, mode, args)):
            raise ValueError("framework event text fields must be strings")
        if not all(_is_int(v) for v in (start, end, pid)) or not (step is None or _is_int(step)):
            raise ValueError("framework event times, pid and step must be integers")
        out.append(FrameworkEvent(kind, name, start, end, mode, step, pid, args))
    return out


def _expanded(batch: list | tuple) -> list:
    """Step records (an event with its phases as a 9th field, see `stallwatch.torch.steps`) as events."""
    out: list = []
    for values in batch:
        if isinstance(values, (list, tuple)) and len(values) == len(_FIELDS) + 1:
            *event, phases = values
            if not isinstance(phases, (list, tuple)):
                raise ValueError("a step's phases must be a list")
            out.append(event)
            for phase in phases:
                if not isinstance(phase, (list, tuple)) or len(phase) != 5:
                    raise ValueError("a phase is (kind, name, start_us, end_us, args)")
                kind, name, start, end, args = phase
                out.append((kind, name, start, end, event[4], event[5], event[6], args))
        else:
            out.append(values)
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63)


_sender: EventSender | None = None
_sender_lock = threading.Lock()
_senders: weakref.WeakSet[EventSender] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child (a data-loader worker, a Pool worker, os.fork) must not reuse, resend or wait on its
    parent's senders and lock; it gets its own sender if it records anything."""
    global _sender, _sender_lock
    _sender = None
    _sender_lock = threading.Lock()
    for sender in list(_senders):
        sender._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def sender_from_env(on_message: Callable[[dict[str, Any]], None] | None = None) -> EventSender | None:
    """The process's sender when running under `stallwatch run`, else None (one per process).
    `on_message` is set on it when given (the process's profiling session listens for live config)."""
    global _sender
    address = os.environ.get(ENV_EVENTS)
    if not address:
        return None
    try:
        with _sender_lock:
            if _sender is None or _sender.identity.get("pid") != os.getpid():  # a forked child gets its own
                _sender = EventSender(address, on_message=on_message)
            elif on_message is not None:
                _sender.on_message = on_message
            return _sender
    except Exception as exc:  # e.g. no thread can be started: the job runs on without framework events
        warn_once("events-sender", "framework events are off (%s: %s)", type(exc).__name__, exc)
        return None


def reset_sender() -> None:
    """Forget the process's sender (after it was closed), so a later session gets a fresh one."""
    global _sender
    with _sender_lock:
        _sender = None
