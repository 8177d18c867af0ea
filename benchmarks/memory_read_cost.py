"""What reading each step's memory costs a step (torch/memory.py: one pread of /proc/self/statm per step, and on
CUDA the allocator's statistics at most every 200 ms), against the hooks' budget of 20 µs a timed step.

Times the step tracker's own bookkeeping for a loader-delimited step (ask for a batch, get it, forward, backward,
optimizer step) with the memory reading on and off, interleaved in rounds so the machine's drift hits both alike,
and the bare read. Prints a table (docs/benchmarks.md). `python benchmarks/memory_read_cost.py [ROUNDS] [STEPS]`."""

from __future__ import annotations

import statistics
import sys
import time
from typing import ClassVar

from stallwatch.torch.memory import StepMemory
from stallwatch.torch.steps import StepTracker, now_us


class _Off:
    """A reader that reads nothing: the tracker as it was before memory was recorded."""

    limits: ClassVar[list] = []

    def read(self, end_us: int) -> str:
        return ""


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


def _cuda_read_us(n: int) -> float | None:
    """The allocator's statistics call alone, where CUDA is there (None otherwise)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.zeros(1, device="cuda")
    mem = StepMemory()
    mem.read(0)
    t0 = time.perf_counter_ns()
    for i in range(n):
        mem._cuda()
    return (time.perf_counter_ns() - t0) / n / 1000.0


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    on, off = StepTracker(lambda e: None, 1), StepTracker(lambda e: None, 1)
    off._memory = _Off()  # type: ignore[assignment]
    _steps(on, n), _steps(off, n)  # warm
    res: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        res["off"].append(_steps(off, n))
        res["on"].append(_steps(on, n))
    mem = StepMemory()
    mem.read(0)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        mem.read(0)
    read_us = (time.perf_counter_ns() - t0) / n / 1000.0
    cuda_us = _cuda_read_us(min(n, 2000))
    deltas = [a - b for a, b in zip(res["on"], res["off"])]
    print(f"{rounds} rounds x {n} steps, Python {sys.version.split()[0]}")
    print("| variant | median µs/step | mean µs/step |")
    print("|---|---|---|")
    for name in ("off", "on"):
        print(f"| tracker, memory reading {name} | {statistics.median(res[name]):.2f} | "
              f"{statistics.mean(res[name]):.2f} |")
    print(f"| Δ per step (on − off), per round | {statistics.median(deltas):+.2f} | {statistics.mean(deltas):+.2f} |")
    print(f"| one host read (pread + parse + format) | {read_us:.2f} | |")
    if cuda_us is not None:
        print(f"| one CUDA allocator read (every 200 ms at most) | {cuda_us:.2f} | |")


if __name__ == "__main__":
    main()
