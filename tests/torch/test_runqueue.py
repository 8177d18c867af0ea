"""Each step records its training thread's run-queue delay (`runq_us`) and, where a DataLoader wait opened it, the
part of it inside that wait (`wait_runq_us`): one read of the thread's schedstat per step boundary, reused where one
step ends as the next begins, and one when the read ends; nothing when there is no delay or no reading."""

from __future__ import annotations

import os
import time
from typing import ClassVar

import pytest

from stallwatch.records import STEP
from stallwatch.torch import steps as step_tracking
from stallwatch.torch.runqueue import PeerRunQueue, RunQueueClock
from stallwatch.torch.steps import StepTracker, now_us


class _Clock:
    """A run-queue clock that advances by the given ns at each read (-1: unknown)."""

    def __init__(self, *steps: int) -> None:
        self.steps, self.reads, self.value = list(steps), 0, 0

    def read(self) -> int:
        self.reads += 1
        step = self.steps.pop(0) if self.steps else 0
        if step < 0:
            return -1
        self.value += step
        return self.value


class _NoMemory:
    limits: ClassVar[list] = []

    def read(self, end_us: int) -> str:
        return ""


def _loop(tracker: StepTracker, n: int) -> None:
    for _ in range(n):
        w = tracker.batch_begin(1, True)
        tracker.batch_end(1, w, False)
        t = now_us()
        tracker.forward(t, t, "Net", True)
        tracker.backward(t, t)
    tracker.finish()


def test_each_step_says_how_long_it_waited_for_a_cpu_and_how_much_of_it_in_its_read(monkeypatch):
    monkeypatch.setattr(step_tracking, "WAIT_RUNQ_MIN_US", 0)  # these waits take no time: each is read
    events: list[tuple] = []
    tracker = StepTracker(events.append, 1)
    tracker._runq = clock = _Clock(0, 1_000_000, 2_000_000, 0, 0, 1_000, 500, -1, -1)  # type: ignore[assignment]
    tracker._memory = _NoMemory()  # type: ignore[assignment]  # the step's memory: tests/torch/test_memory.py
    _loop(tracker, 4)
    steps = [e for e in events if e[0] == STEP]
    assert [s[7] for s in steps] == ['{"runq_us": 3000, "wait_runq_us": 1000}', '{"runq_us": 0, "wait_runq_us": 0}',
                                     '{"runq_us": 1, "wait_runq_us": 1}', ""]
    assert clock.reads == 9  # the first step's start, then each step's read and its end (the next one's start)


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstats")
def test_the_clock_reads_this_threads_delay_and_a_forked_child_its_own():
    clock = RunQueueClock()
    first = clock.read()
    assert first >= 0 and clock.read() >= first
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child's clock names the child's thread, not its parent's
        os.write(w, str(clock.read()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert int(os.read(r, 64)) < first + 10**9
    clock.close()


def test_a_wait_too_short_to_matter_costs_no_read():
    events: list[tuple] = []
    tracker = StepTracker(events.append, 1)
    tracker._runq = clock = _Clock(0, 1_000, 1_000, 1_000)  # type: ignore[assignment]
    tracker._memory = _NoMemory()  # type: ignore[assignment]
    _loop(tracker, 3)
    assert clock.reads == 4 and all("wait_runq_us" not in e[7] for e in events if e[0] == STEP)


class _Peers:
    """Native peers whose largest delay since the last read is the next of `values` (µs; -1: none read then)."""

    peers = 2

    def __init__(self, *values: int) -> None:
        self.values, self.reads = list(values), 0

    def read(self) -> int:
        self.reads += 1
        return self.values.pop(0) if self.values else 0


def test_a_step_says_how_long_its_native_peers_waited_for_a_cpu_when_the_reads_cost_little(monkeypatch):
    """Read at each step's end where it is long enough for the reads to cost 1/PEER_BUDGET of it, and counted for a
    step whose start was read too: the first read has nothing before it, a peer that waited nothing says nothing."""
    monkeypatch.setattr(step_tracking, "PEER_BUDGET", 0)  # these steps take no time: each end is read
    events: list[tuple] = []
    tracker = StepTracker(events.append, 1)
    tracker._runq = _Clock()  # type: ignore[assignment]
    tracker._memory = _NoMemory()  # type: ignore[assignment]
    tracker._peers = peers = _Peers(700, 5000, 0, 12)  # type: ignore[assignment]
    _loop(tracker, 4)
    args = [e[7] for e in events if e[0] == STEP]
    # the first step's delay (0) is said once: the run reads as measured (tests/analyze/rules/test_contention.py)
    assert args == ['{"runq_us": 0}', '{"peer_runq_us": 5000}', "", '{"peer_runq_us": 12}']
    assert peers.reads == 4


def test_short_steps_read_no_peer():
    events: list[tuple] = []
    tracker = StepTracker(events.append, 1)
    tracker._runq = _Clock()  # type: ignore[assignment]
    tracker._memory = _NoMemory()  # type: ignore[assignment]
    tracker._peers = peers = _Peers(700, 5000)  # type: ignore[assignment]
    _loop(tracker, 3)  # microseconds each, under PEER_BUDGET × 2 µs × 2 peers
    assert peers.reads == 0 and all("peer_runq_us" not in e[7] for e in events if e[0] == STEP)


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat") or (os.cpu_count() or 1) < 2,
                    reason="Linux schedstats, two CPUs for an intra-op pool")
def test_the_peers_are_the_native_threads_and_not_pythons_nor_the_reader():
    """torch's intra-op pool (native threads) is read; a Python thread is not, nor the thread that reads."""
    torch = pytest.importorskip("torch")
    import threading

    torch.set_num_threads(2)
    torch.ones(1 << 22).mul(2).sum()  # starts the intra-op pool
    stop = threading.Event()
    python_thread = threading.Thread(target=stop.wait, daemon=True)
    python_thread.start()
    peers = PeerRunQueue()
    try:
        assert peers.read() == -1  # nothing read before: no delay to say
        listed = set(peers._files)
        assert listed and python_thread.native_id not in listed and threading.get_native_id() not in listed
        assert peers.read() >= 0
    finally:
        stop.set()
        peers.close()


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstats")
def test_a_peer_that_ended_is_dropped_so_a_thread_reusing_its_tid_is_read_afresh(monkeypatch):
    """A kept file names its thread for good: once that thread ends, the file is dropped, and the next listing opens
    whatever thread holds the tid then (Linux reuses tids)."""
    import threading

    from stallwatch.torch import runqueue

    monkeypatch.setattr(runqueue, "_threads", lambda: [])  # every thread counts as native here
    monkeypatch.setattr(runqueue, "PEERS_MAX", 1 << 20)  # whatever threads earlier tests left in this process
    go, again = threading.Event(), threading.Event()
    peer = threading.Thread(target=go.wait, daemon=True)
    peer.start()
    peers = PeerRunQueue()
    try:
        peers.read()
        assert peer.native_id in peers._files
        go.set()
        peer.join()  # Python's join returns before the kernel's thread is gone
        gone = f"/proc/self/task/{peer.native_id}"
        for _ in range(2000):
            if not os.path.exists(gone):
                break
            time.sleep(0.005)
        peers.read()
        assert peer.native_id not in peers._files and peer.native_id not in peers._last
        later = threading.Thread(target=again.wait, daemon=True)
        later.start()
        monkeypatch.setattr(runqueue, "PEERS_REFRESH_NS", -1)  # list again at the next read
        peers.read()
        assert later.native_id in peers._files
        assert peers.read() >= 0  # the newcomer is read, whatever tid it took
    finally:
        go.set()
        again.set()
        peers.close()


def _schedstat_fds() -> set[str]:
    """The /proc schedstat files this process holds open."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith("/schedstat"):
            held.add(fd)
    return held


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstats")
def test_a_closed_tracker_holds_no_proc_file(monkeypatch):
    """A job that stops profiling and trains on keeps none of the files the per-step reads kept open."""
    import threading

    from stallwatch.torch import runqueue

    monkeypatch.setattr(runqueue, "_threads", lambda: [])  # every other thread counts as a native peer here
    monkeypatch.setattr(step_tracking, "PEER_BUDGET", 0)  # these steps take no time: each end reads the peers
    go = threading.Event()
    peer = threading.Thread(target=go.wait, daemon=True)
    peer.start()
    before = _schedstat_fds()
    tracker = StepTracker([].append, 1)
    try:
        _loop(tracker, 3)
        assert len(_schedstat_fds() - before) >= 2  # its own thread's and its peer's
        tracker.close()
        assert _schedstat_fds() - before == set()
        assert tracker._runq.read() == -1  # a late read after close costs nothing and says nothing
    finally:
        go.set()
        tracker.close()
