"""stallwatch's own cost in the training process, measured now and then: for a short window every few seconds each
hook times its own work (not the user's code it calls), so a run can say how much of its loop stallwatch took —
which matters where steps last tens of microseconds and a hook's few microseconds are a real share of them."""

from __future__ import annotations

import time
from typing import Any, Callable

WINDOW_S = 0.25  # how long each window lasts
EVERY_S = 10.0  # one window this often: the timing itself costs only inside windows (2.5 % of the time)
FIRST_AFTER_S = 2.0

_perf = time.perf_counter_ns
_thread_cpu = time.thread_time_ns


class Probe:
    """`on` is read by every hook; the sender's thread opens and closes windows (`tick`). Totals are cumulative:
    `own_ns` of hook work and `sender_ns` of the sender's CPU inside `window_ns`, the span of the windows in which a
    hook ran (a window's whole span, not its first to last call: two calls of a slow loop would make a few µs look
    like a large share)."""

    def __init__(self) -> None:
        self.on = False
        self.own_ns = 0
        self.window_ns = 0
        self.calls = 0
        self.sender_ns = 0  # CPU of the thread that ticks (the event sender: it holds the interpreter's lock)
        self._opened_ns = 0
        self._sender_at_open = 0
        self._used = False
        self.sampled = False  # steps are sampled (torch/sampling.py): a window without hook calls counts too
        self._opened = 0.0
        self._next = time.monotonic() + FIRST_AFTER_S

    def tick(self, now: float | None = None) -> None:
        """Open a window when one is due, close the open one when it has lasted WINDOW_S."""
        now = time.monotonic() if now is None else now
        if self.on:
            if now - self._opened >= WINDOW_S:
                self.finish()
        elif now >= self._next:
            self._next, self._opened = now + EVERY_S, now
            self.open()

    def open(self) -> None:
        self._opened_ns, self._used = _perf(), False
        self._sender_at_open = _thread_cpu()
        self.on = True

    def finish(self, by_ticker: bool = True) -> None:
        """Close the window (if one is open); it counts when a hook ran in it. The ticking thread's CPU in it
        counts too, when that thread closes it (`by_ticker`)."""
        if not self.on:
            return
        self.on = False
        if self._used or self.sampled:
            self.window_ns += _perf() - self._opened_ns
            if by_ticker:
                self.sender_ns += max(0, _thread_cpu() - self._sender_at_open)

    def account(self, own: int) -> None:
        self.own_ns += own
        self.calls += 1
        self._used = True

    def wrap(self, build: Callable[[Callable[..., Any], Callable[..., Any] | None], Callable[..., Any]],
             original: Callable[..., Any]) -> Callable[..., Any]:
        """The wrapper to install: `build(orig, probed)` makes a wrapper around `orig` that hands its call to
        `probed` (when not None) while a window is open (checked after anything torch.compile may trace, so that
        it never guards on the flag); `probed` runs a twin whose `orig` is timed, so the
        wrapper's own time is its whole time less the original's (re-entered calls keep their own tally)."""
        inner = [0]

        def timed_original(*args: Any, **kwargs: Any) -> Any:
            t = _perf()
            try:
                return original(*args, **kwargs)
            finally:
                inner[0] += _perf() - t

        twin = build(timed_original, None)
        probe = self

        def probed(*args: Any, **kwargs: Any) -> Any:
            t0, saved = _perf(), inner[0]
            inner[0] = 0
            try:
                return twin(*args, **kwargs)
            finally:
                spent, inner[0] = inner[0], saved
                probe.account(_perf() - t0 - spent)

        return build(original, probed)

    def measured(self, fn: Callable[..., Any], bypass: Callable[[], bool] = lambda: False) -> Callable[..., Any]:
        """A hook function that calls none of the user's code, timed whole while a window is open; never while
        `bypass()` (torch.compile tracing the hook: it must not guard on a flag that flips)."""
        probe = self

        def hook(*args: Any, **kwargs: Any) -> Any:
            if bypass() or not probe.on:
                return fn(*args, **kwargs)
            t0 = _perf()
            try:
                return fn(*args, **kwargs)
            finally:
                probe.account(_perf() - t0)

        return hook
