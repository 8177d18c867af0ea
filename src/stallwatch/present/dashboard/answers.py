"""One computation per question and state of a run, however many clients ask: answers are kept (as the bytes
sent) under the run's change stamp, and clients asking the same question while it is being computed wait for
that one computation instead of starting their own. The server's work then follows the run's changes, not the
number of its clients."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Callable, Hashable

MAX_ANSWERS = 128  # per run: a page asks about a dozen questions; zooms add a few each
MAX_BYTES = 32 << 20  # per run: the kept answers together (a zoomed timeline is a few hundred KB)


class Answers:
    def __init__(self, max_answers: int = MAX_ANSWERS) -> None:
        self._lock = threading.Lock()
        self._done: OrderedDict[Hashable, tuple[Hashable, Any]] = OrderedDict()  # question -> (stamp, answer)
        self._running: dict[tuple[Hashable, Hashable], Future[Any]] = {}
        self._max = max_answers
        self.computed = 0  # how many answers were computed (the rest were shared)
        self.shared = 0

    def _bytes(self) -> int:
        return sum(len(v) for _, v in self._done.values() if isinstance(v, (bytes, bytearray)))

    def peek(self, question: Hashable, stamp: Hashable) -> Any | None:
        """The kept answer when it is of this stamp, else None (cheap: for the event loop)."""
        with self._lock:
            entry = self._done.get(question)
            if entry is not None and entry[0] == stamp:
                self.shared += 1
                return entry[1]
        return None

    def get(self, question: Hashable, stamp: Hashable, compute: Callable[[], Any]) -> Any:
        """The answer to `question` at `stamp`: kept, being computed by another caller (waited for), or computed
        here. An exception is every waiting caller's, and nothing is kept."""
        with self._lock:
            entry = self._done.get(question)
            if entry is not None and entry[0] == stamp:
                self._done.move_to_end(question)
                self.shared += 1
                return entry[1]
            running = self._running.get((question, stamp))
            owner = running is None
            future: Future[Any] = Future() if running is None else running
            if owner:
                self._running[(question, stamp)] = future
            else:
                self.shared += 1
        if not owner:
            return future.result()
        try:
            value = compute()
        except BaseException as exc:
            with self._lock:
                self._running.pop((question, stamp), None)
            future.set_exception(exc)
            raise
        with self._lock:
            self._running.pop((question, stamp), None)
            self.computed += 1
            self._done[question] = (stamp, value)
            self._done.move_to_end(question)
            while len(self._done) > 1 and (len(self._done) > self._max or self._bytes() > MAX_BYTES):
                self._done.popitem(last=False)  # the least recently asked
        future.set_result(value)
        return value
