"""Turns what the hooks see (batches fetched, forward, backward, optimizer steps) into steps: each step's
start, end, number and mode, with its phases. Pure Python, no torch: the hooks feed it timestamps.

Where steps come from, best first: explicit marks (`prof.step()`, the Lightning and Transformers callbacks);
the data loader (a step runs from asking for a batch to asking for the next one); and, when the loop never
iterates a DataLoader, `optimizer.step()` (a coarser step, said once)."""

from __future__ import annotations

import time
from typing import Protocol

from stallwatch.log import warn_once
from stallwatch.records import BACKWARD, DATA_WAIT, EVAL, FORWARD, GLOBAL, OPTIMIZER, STEP, TRAIN

LOADER, EXPLICIT, OPTIMIZER_SOURCE = "loader", "explicit", "optimizer"
MAX_EVENTS_PER_STEP = 10_000  # a step that records more (a loop inside one step) keeps its first ones
MAX_PENDING_WAITS = 64
STEP_NAMES = {TRAIN: "train_step", EVAL: "eval_step", GLOBAL: "step"}


_time_ns = time.time_ns


def now_us() -> int:
    return _time_ns() // 1000


def expand(record: tuple) -> list[tuple]:
    """A step record (FrameworkEvent fields + its phases as `(kind, name, start_us, end_us, args)`) as the
    step's events, each in FrameworkEvent field order; any other event as itself."""
    if len(record) != 9:
        return [record]
    kind, name, start, end, mode, step, pid, args, phases = record
    return [(kind, name, start, end, mode, step, pid, args),
            *((k, n, t0, t1, mode, step, pid, a) for k, n, t0, t1, a in phases)]


class StepListener(Protocol):
    """Told about step boundaries in the training thread (the profiling windows start and stop there)."""

    def on_step_begin(self, mode: str, step: int, now_us: int) -> None: ...
    def on_step_end(self, mode: str, step: int, start_us: int, end_us: int) -> None: ...


class _Step:
    __slots__ = ("start_us", "last_us", "events", "work", "backward", "forward", "mode", "loader",
                 "predicted_mode", "predicted_step")

    def __init__(self, start_us: int, mode: str | None, predicted_mode: str, predicted_step: int,
                 loader: int | None = None) -> None:
        self.start_us = start_us
        self.last_us = start_us
        self.events: list[tuple] = []  # (kind, name, start_us, end_us, args)
        self.work = False  # forward, backward or optimizer seen: the next batch request ends this step
        self.backward = False
        self.forward = False
        self.mode = mode  # given explicitly, else resolved at the end
        self.loader = loader
        self.predicted_mode = predicted_mode
        self.predicted_step = predicted_step


class StepTracker:
    """Not thread-safe: the training thread is its only caller (the hooks call it there)."""

    def __init__(self, emit, pid: int, listener: StepListener | None = None) -> None:
        """`emit(tuple)` takes an event in FrameworkEvent field order (the sender's hot path)."""
        self._emit = emit
        self.pid = pid
        self.listener = listener
        self.counts = {TRAIN: 0, EVAL: 0, GLOBAL: 0}
        self.source: str | None = None
        self._open: _Step | None = None
        self._pending: list[tuple] = []  # data waits seen outside an explicit step: they belong to the next
        self._loader_modes: dict[int, str] = {}
        self._last_end = 0  # steps never overlap: a step starts no earlier than the previous one ended

    @property
    def in_step(self) -> bool:
        return self._open is not None

    # -- the data loader ------------------------------------------------------------------------------
    def batch_begin(self, loader: int, grad_enabled: bool) -> int:
        """A batch is asked for: with loader-delimited steps, the step before ends and a new one begins."""
        t0 = now_us()
        if self.source == EXPLICIT:
            return t0
        step = self._open
        if step is not None and step.work:
            self._close(t0)
            step = None
        if step is None:
            mode = self._loader_modes.get(loader) or (TRAIN if grad_enabled else EVAL)
            self._begin(_Step(t0, None, mode, self.counts[mode], loader))
        return t0

    def batch_end(self, loader: int, t0: int, exhausted: bool) -> None:
        t1 = now_us()
        if self.source == EXPLICIT:
            if self._open is not None and not self._open.work:  # fetched inside `with prof.step():`
                self._add(self._open, DATA_WAIT, "next_batch", t0, t1, "")
            elif not exhausted:  # fetched for the next step (before its mark, or after this one's work)
                self._pending.append((t0, t1))
                del self._pending[:-MAX_PENDING_WAITS]
            return
        self.source = LOADER
        step = self._open
        if step is None:
            return
        if exhausted:
            if not step.work:
                self._open = None  # the request that found the loader empty: no step
            return
        self._add(step, DATA_WAIT, "next_batch", t0, t1, "")

    # -- phases ---------------------------------------------------------------------------------------
    # The phase methods run a few times per step: the common case (inside a step) is inlined.
    def forward(self, t0: int, t1: int, name: str, grad_enabled: bool) -> None:
        step = self._open
        if step is None:
            if self.source in (None, OPTIMIZER_SOURCE) and grad_enabled:
                step = self._optimizer_step(t0)
            else:
                self._standalone(FORWARD, name, t0, t1, TRAIN if grad_enabled else EVAL)
                return
        step.work = step.forward = True
        if t1 > step.last_us:
            step.last_us = t1
        if len(step.events) < MAX_EVENTS_PER_STEP:
            step.events.append((FORWARD, name, t0, t1, ""))

    def backward(self, t0: int, t1: int) -> None:
        self._train_phase(BACKWARD, "backward", t0, t1)

    def optimizer(self, t0: int, t1: int, name: str) -> None:
        self._train_phase(OPTIMIZER, name, t0, t1)
        if self.source == OPTIMIZER_SOURCE:
            self._close(t1)

    def _train_phase(self, kind: str, name: str, t0: int, t1: int) -> None:
        """Backward or an optimizer step: the step it is in becomes a TRAIN step."""
        step = self._open
        if step is None:
            if self.source in (None, OPTIMIZER_SOURCE):
                step = self._optimizer_step(t0)
            else:
                self._standalone(kind, name, t0, t1, TRAIN)
                return
        step.work = step.backward = True
        if t1 > step.last_us:
            step.last_us = t1
        if len(step.events) < MAX_EVENTS_PER_STEP:
            step.events.append((kind, name, t0, t1, ""))

    def other(self, kind: str, name: str, t0: int, t1: int, args: str = "") -> None:
        """Anything else timed inside the loop (a collective, a fetch in the main process…)."""
        step = self._open
        if step is None:
            self._standalone(kind, name, t0, t1, GLOBAL)
        else:
            self._add(step, kind, name, t0, t1, args)

    # -- explicit marks -------------------------------------------------------------------------------
    def begin_step(self, mode: str | None) -> None:
        """An explicit step begins now (ending the one before); a batch fetched since then belongs to it."""
        t = now_us()
        if self.source != EXPLICIT and self._open is not None:
            # Hand-over from automatic steps: the open one ends here, with what it did.
            if not self._open.work:
                self._pending = [(e[2], e[3]) for e in self._open.events if e[0] == DATA_WAIT]
                self._open = None
        self.source = EXPLICIT
        if self._open is not None:
            # Marker style: the step before ended when the batch for this one was asked for.
            fetched = self._pending[0][0] if self._pending else t
            self._close(fetched if self._open.last_us <= fetched <= t else t)
        start = max(self._pending[0][0], self._last_end) if self._pending else t
        predicted = mode or TRAIN
        step = _Step(start, mode, predicted, self.counts[predicted])
        for t0, t1 in self._pending:
            self._add(step, DATA_WAIT, "next_batch", t0, t1, "")
        self._pending.clear()
        self._begin(step)

    def end_step(self) -> None:
        if self._open is not None:
            self._close(now_us())

    def finish(self) -> None:
        """At exit: a step with work in it ends where its last phase ended; an empty one is dropped."""
        step = self._open
        if step is not None and step.work:
            self._close(step.last_us)
        self._open = None

    # -- internals ------------------------------------------------------------------------------------
    def _optimizer_step(self, t0: int) -> _Step:
        if self.source is None:
            warn_once("steps-from-optimizer", "no DataLoader iteration seen: steps are delimited by "
                      "optimizer.step() (coarser; use stallwatch.torch.profile().step() for exact steps)")
            self.source = OPTIMIZER_SOURCE
        step = _Step(t0, None, TRAIN, self.counts[TRAIN])
        self._begin(step)
        return step

    def _begin(self, step: _Step) -> None:
        self._open = step
        if self.listener is not None:
            self.listener.on_step_begin(step.predicted_mode, step.predicted_step, step.start_us)

    def _add(self, step: _Step, kind: str, name: str, t0: int, t1: int, args: str) -> None:
        if t1 > step.last_us:
            step.last_us = t1
        if len(step.events) < MAX_EVENTS_PER_STEP:
            step.events.append((kind, name, t0, t1, args))

    def _standalone(self, kind: str, name: str, t0: int, t1: int, mode: str) -> None:
        self._emit((kind, name, t0, t1, mode, None, self.pid, ""))

    def _close(self, end_us: int) -> None:
        step = self._open
        self._open = None
        if step is None:
            return
        mode = step.mode or (TRAIN if step.backward else EVAL if step.forward else
                             self._loader_modes.get(step.loader, GLOBAL) if step.loader is not None else GLOBAL)
        number = self.counts[mode]
        self.counts[mode] = number + 1
        self._last_end = end_us
        if step.loader is not None and step.work:
            self._loader_modes[step.loader] = mode
        # One record per step, its phases inside: the fewest objects built in the training thread. All
        # tuples of plain values: the garbage collector stops tracking them while they wait to be sent
        # (lists would stay tracked and, thousands at a time, trigger full collections of the job's heap).
        self._emit((STEP, STEP_NAMES[mode], step.start_us, end_us, mode, number, self.pid, "",
                    tuple(step.events)))
        if self.listener is not None:
            self.listener.on_step_end(mode, number, step.start_us, end_us)
