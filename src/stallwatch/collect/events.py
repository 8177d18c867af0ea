"""The training process's side of framework events: hooks call `emit()`, which only appends to a bounded
queue; a background thread ships batches to the sampler process over a Unix socket. No file or network
I/O ever happens in the training process, and nothing here raises into it."""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
from collections import deque

from stallwatch.log import warn_once
from stallwatch.records import FrameworkEvent

ENV_EVENTS = "STALLWATCH_EVENTS"  # the sampler's socket path, set by `stallwatch run` for the job
SEND_INTERVAL_S = 0.1
RECONNECT_AFTER_S = 2.0  # the sampler may be restarting: try again after this long
MAX_QUEUED_EVENTS = 100_000
_FIELDS = ("kind", "name", "start_us", "end_us", "mode", "step", "pid", "args")


def process_identity() -> dict[str, int]:
    """Rank, local rank and world size as torchrun (and most launchers) set them; 0/0/1 otherwise."""
    def num(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default
    return {"rank": num("RANK", 0), "local_rank": num("LOCAL_RANK", 0), "world_size": num("WORLD_SIZE", 1),
            "pid": os.getpid()}


class EventSender:
    """Never blocks the caller, never raises into it; drops (and says so once) when it cannot keep up."""

    def __init__(self, address: str, identity: dict[str, int] | None = None,
                 max_queued: int = MAX_QUEUED_EVENTS) -> None:
        self.address = address
        self.identity = identity or process_identity()
        self._queue: deque[FrameworkEvent] = deque()
        self._max = max_queued
        self.dropped = 0
        self.sent = 0
        self._sock: socket.socket | None = None
        self._retry_at = 0.0  # while unreachable: no connection attempts before this (monotonic) time
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one sender at a time (the thread, or close())
        self._thread = threading.Thread(target=self._run, name="stallwatch-events", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def emit(self, event: FrameworkEvent) -> None:
        """Queue one event (a deque append: well under a microsecond)."""
        if len(self._queue) >= self._max:
            self.dropped += 1
            if self.dropped == 1:
                warn_once("events-dropped", "framework events are produced faster than they can be sent; "
                          "dropping some (counted)")
            return
        self._queue.append(event)

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (bounded by `timeout_s`) and disconnect; called at exit too."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._thread.join(timeout_s)
        self._send_queued(deadline=deadline)
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.close()
                except OSError:
                    pass
                self._sock = None

    def _run(self) -> None:
        while not self._stop.wait(SEND_INTERVAL_S):
            self._send_queued(deadline=None)

    def _send_queued(self, deadline: float | None) -> None:
        try:
            with self._lock:
                while self._queue:
                    if deadline is not None and time.monotonic() > deadline:
                        return
                    batch = [self._queue.popleft() for _ in range(min(len(self._queue), 2000))]
                    # One JSON array per batch, built from plain tuples: the least time holding the GIL.
                    payload = (json.dumps([(e.kind, e.name, e.start_us, e.end_us, e.mode, e.step, e.pid, e.args)
                                           for e in batch], separators=(",", ":")) + "\n").encode()
                    if not self._send(payload):
                        self.dropped += len(batch)
                        return
                    self.sent += len(batch)
        except Exception as exc:  # never into the training loop, never kill the thread silently
            warn_once("events-send", "sending framework events failed (%s: %s); they are dropped",
                      type(exc).__name__, exc)

    def _send(self, payload: bytes) -> bool:
        if self._sock is None:
            if time.monotonic() < self._retry_at:
                return False
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(2.0)
                sock.connect(self.address)
                sock.sendall((json.dumps({"hello": self.identity}) + "\n").encode())
                self._sock = sock
            except OSError as exc:
                self._retry_at = time.monotonic() + RECONNECT_AFTER_S
                warn_once("events-connect", "cannot reach the stallwatch sampler at %s (%s); framework events "
                          "are dropped until it answers", self.address, exc.strerror or exc)
                return False
        try:
            self._sock.sendall(payload)
            return True
        except OSError as exc:
            self._sock.close()
            self._sock = None
            self._retry_at = time.monotonic() + RECONNECT_AFTER_S
            warn_once("events-lost", "lost the stallwatch sampler (%s); framework events are dropped until it "
                      "is back", exc.strerror or exc)
            return False


def decode_batch(line: bytes) -> list[FrameworkEvent]:
    """One line from a sender: a JSON array of events, each `[kind, name, start_us, end_us, mode, step, pid, args]`."""
    batch = json.loads(line)
    if not isinstance(batch, list):
        raise ValueError("not a batch of framework events")
    out = []
    for values in batch:
        if not isinstance(values, list) or len(values) != len(_FIELDS):
            raise ValueError("not a framework event")
        kind, name, start, end, mode, step, pid, args = values
        # Checked here, not when a file is written: one bad event must not block a rank's writer.
        if not all(isinstance(v, str) for v in (kind, name, mode, args)):
            raise ValueError("framework event text fields must be strings")
        if not all(_is_int(v) for v in (start, end, pid)) or not (step is None or _is_int(step)):
            raise ValueError("framework event times, pid and step must be integers")
        out.append(FrameworkEvent(kind, name, start, end, mode, step, pid, args))
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63)


_sender: EventSender | None = None
_sender_lock = threading.Lock()


def sender_from_env() -> EventSender | None:
    """The process's sender when running under `stallwatch run`, else None (one per process)."""
    global _sender
    address = os.environ.get(ENV_EVENTS)
    if not address:
        return None
    try:
        with _sender_lock:
            if _sender is None or _sender.identity.get("pid") != os.getpid():  # a forked child gets its own
                _sender = EventSender(address)
            return _sender
    except Exception as exc:  # e.g. no thread can be started: the job runs on without framework events
        warn_once("events-sender", "framework events are off (%s: %s)", type(exc).__name__, exc)
        return None
