"""What reading the training thread's run-queue delay costs a step (torch/runqueue.py, one pread of
/proc/thread-self/schedstat per step boundary), against the hooks' budget of 20 µs a timed step.

Times the step tracker's own bookkeeping for a loader-delimited step (ask for a batch, get it, forward, backward,
optimizer step) with the reading on and off, interleaved in rounds so the machine's drift hits both alike, and
the bare read. Then the native peers' reading (`PeerRunQueue.read`, torch's intra-op pool of 2, 8 and 32 threads
where torch is installed) against the shortest step it is read at (`steps.PEER_BUDGET`). Prints tables
(docs/benchmarks.md). `python benchmarks/runq_read_cost.py [ROUNDS] [STEPS]`."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from stallwatch.torch.runqueue import PEER_READ_COST_US, PeerRunQueue, RunQueueClock
from stallwatch.torch.steps import PEER_BUDGET, StepTracker, now_us


class _Off:
    """A clock that reads nothing: the tracker as it was before the run-queue delay was recorded."""

    def read(self) -> int:
        return -1


def _steps(tracker: StepTracker, n: int) -> float:
    """µs per step of the tracker's work alone (the events it emits are dropped)."""
    t0 = time.perf_counter_ns()
    for _ in range(n):
        w = tracker.batch_begin(1, True)
        tracker.batch_end(1, w, False)
        t = now_us()
        tracker.forward(t, t, "Net", True)
        tracker.backward(t, t)
        tracker.optimizer_begin(t)
        tracker.optimizer(t, t, "SGD")
    return (time.perf_counter_ns() - t0) / n / 1000.0


def _per_read_us(read: Callable[[], object], n: int) -> float:
    """µs per call of `read`, after a first call (which opens or lists what it reads)."""
    read()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        read()
    return (time.perf_counter_ns() - t0) / n / 1000.0


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    on, off = StepTracker(lambda e: None, 1), StepTracker(lambda e: None, 1)
    off._runq = _Off()  # type: ignore[assignment]
    _steps(on, n), _steps(off, n)  # warm
    res: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        res["off"].append(_steps(off, n))
        res["on"].append(_steps(on, n))
    read_us = _per_read_us(RunQueueClock().read, n)
    deltas = [a - b for a, b in zip(res["on"], res["off"])]
    print(f"{rounds} rounds x {n} steps, Python {sys.version.split()[0]}")
    print("| variant | median µs/step | mean µs/step |")
    print("|---|---|---|")
    for name in ("off", "on"):
        print(f"| tracker, run-queue reading {name} | {statistics.median(res[name]):.2f} | {statistics.mean(res[name]):.2f} |")
    print(f"| Δ per step (on − off), per round | {statistics.median(deltas):+.2f} | {statistics.mean(deltas):+.2f} |")
    print(f"| one read (pread + parse) | {read_us:.2f} | |")
    _peers(n)


def _peers(n: int) -> None:
    """The peers' read per pool size: µs per read, and its share of the shortest step that pays it."""
    try:
        import torch
    except ImportError:
        print("torch is not installed: the peers' read is not measured")
        return
    print("| intra-op threads | peers read | µs per read | shortest step read (µs) | share of it |")
    print("|---|---|---|---|---|")
    for threads in (2, 8, 32):
        torch.set_num_threads(threads)
        torch.ones(1 << 22).mul(2).sum()  # starts the pool
        peers = PeerRunQueue()
        us = _per_read_us(peers.read, n)
        floor = PEER_BUDGET * PEER_READ_COST_US * max(peers.peers, 1)
        print(f"| {threads} | {peers.peers} | {us:.2f} | {floor} | {100 * us / floor:.2f} % |")
        peers.close()


if __name__ == "__main__":
    main()
