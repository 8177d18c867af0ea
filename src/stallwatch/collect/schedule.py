"""When to take the next snapshot: deadlines on a steady clock, so sampling never drifts."""

from __future__ import annotations

import math
import time
from typing import Callable


class TickSchedule:
    """Deadline k is `start + k * interval`, exactly. A snapshot that overruns skips the deadlines it
    missed (counted in `missed`) instead of bunching snapshots together or shifting every later one."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._start = clock()
        self._k = 1
        self.missed = 0
        self.last_tick: float | None = None

    @property
    def next_deadline(self) -> float:
        return self._start + self._k * self.interval_s

    def time_left(self) -> float:
        return self.next_deadline - self._clock()

    def due(self) -> bool:
        return self._clock() >= self.next_deadline

    def done(self) -> None:
        """Call after the snapshot of the current deadline."""
        self.last_tick = self._clock()
        self._k += 1
        now = self._clock()
        if now >= self.next_deadline:
            behind = math.floor((now - self.next_deadline) / self.interval_s) + 1
            self.missed += behind
            self._k += behind

    def set_interval(self, interval_s: float) -> None:
        """A live change: deadlines restart from the last snapshot (or now), `interval_s` apart."""
        self._start = self.last_tick if self.last_tick is not None else self._clock()
        self._k = 1
        self.interval_s = interval_s

    def since_last(self) -> float:
        """Seconds since the last snapshot (or since the start, before the first one)."""
        return self._clock() - (self.last_tick if self.last_tick is not None else self._start)


class Periodic:
    """Work due every `period_s` that rides on the snapshots' wake-ups: done at a snapshot when its deadline
    comes before the next snapshot's, on its own deadline only otherwise. A sleeping process pays more to
    wake (cold caches) than for such work, so two schedules must not wake it twice (benchmarks/sampler_cost.py)."""

    def __init__(self, period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.period_s = period_s
        self._clock = clock
        self._last = clock()

    @property
    def deadline(self) -> float:
        return self._last + self.period_s

    def due(self, snapshot: TickSchedule | None = None) -> bool:
        """Due now, or — when `snapshot` is due now too — due before the snapshot after it."""
        now = self._clock()
        if now >= self.deadline:
            return True
        return snapshot is not None and snapshot.due() and self.deadline <= now + snapshot.interval_s

    def done(self) -> None:
        self._last = self._clock()
