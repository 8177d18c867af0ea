"""Sampling keeps time on a steady clock: deadlines never drift, overruns skip ticks, never bunch them."""

from __future__ import annotations

import pytest

from stallwatch.collect.schedule import Periodic, TickSchedule


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_day_of_ticks_does_not_drift() -> None:
    """With every snapshot costing 0.3 ms, a sleep(interval) loop would be 4.3 minutes late after a day at
    100 ms; deadlines stay on start + k * interval."""
    clock = FakeClock()
    s = TickSchedule(0.1, clock)
    start = clock.t
    for _ in range(864_000):
        clock.t = s.next_deadline  # woke exactly at the deadline
        assert s.due()
        clock.t += 0.0003  # the snapshot's cost
        s.done()
    assert abs(s.next_deadline - (start + 864_001 * 0.1)) < 1e-6
    assert s.missed == 0


def test_an_overrun_skips_missed_ticks_and_stays_on_the_grid() -> None:
    clock = FakeClock()
    s = TickSchedule(0.5, clock)
    start = clock.t
    clock.t = s.next_deadline
    clock.t += 1.7  # a snapshot stalled 1.7 s (e.g. the machine swapped)
    s.done()
    assert s.missed == 3  # deadlines at +1.0, +1.5, +2.0 passed during the stall
    assert s.next_deadline == start + 2.5  # still on the start + k * interval grid
    assert s.time_left() > 0


def test_not_due_before_the_deadline_and_time_left_counts_down() -> None:
    clock = FakeClock()
    s = TickSchedule(0.2, clock)
    assert not s.due() and abs(s.time_left() - 0.2) < 1e-9
    clock.t += 0.15
    assert not s.due() and abs(s.time_left() - 0.05) < 1e-9
    clock.t = s.next_deadline
    assert s.due()


def test_since_last_counts_from_start_before_the_first_tick() -> None:
    clock = FakeClock()
    s = TickSchedule(1.0, clock)
    clock.t += 0.3
    assert s.last_tick is None and abs(s.since_last() - 0.3) < 1e-9
    clock.t = s.next_deadline
    s.done()
    clock.t += 0.25
    assert abs(s.since_last() - 0.25) < 1e-9


@pytest.mark.parametrize("interval, wakes_per_s, period_range", [
    (0.5, 2, (0.5, 0.5)),  # rides on every snapshot: one wake-up, not two
    (0.1, 10, (0.4, 0.5)),  # on the last snapshot before its deadline
    (2.0, 2, (0.5, 0.5)),  # snapshots too rare: its own deadline wakes the loop (a snapshot rides on it)
])
def test_periodic_work_rides_on_the_snapshots_wake_ups(interval, wakes_per_s, period_range) -> None:
    """The sampler's loop as it runs: it sleeps until the earliest deadline, snapshots when due, and does the
    periodic work (storing events, looking at config.json) when it is due or rides along."""
    clock = FakeClock()
    ticks = TickSchedule(interval, clock=clock)
    work = Periodic(0.5, clock=clock)
    wakes, done_at, end = 0, [], clock.t + 20.0
    while clock.t < end:
        clock.t = min(ticks.next_deadline, work.deadline)
        wakes += 1
        if work.due(ticks):
            done_at.append(clock.t)
            clock.t += 0.002  # the work takes time: its next deadline is not the next snapshot's
            work.done()
        if ticks.due():
            ticks.done()
    assert wakes / 20.0 == pytest.approx(wakes_per_s, rel=0.06)
    gaps = [b - a for a, b in zip(done_at, done_at[1:])]
    assert min(gaps) >= period_range[0] - 0.01 and max(gaps) <= period_range[1] + 0.01
