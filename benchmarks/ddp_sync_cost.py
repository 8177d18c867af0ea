"""What timing DDP's exposed gradient all-reduce on every step costs (torch/ddp_sync.py: a pre-hook on the loss's
grad_fn that queues an autograd final callback, and one collective event in the step), against the same backward
without it, in paired rounds in one process.

Target: the hooks' per-step budget, <= 20 µs a timed step in all; this part should be a few µs.

Run: python benchmarks/ddp_sync_cost.py [--rounds R] [--steps N]

Method
------
* One process, a gloo group of one (world_size 1: the all-reduce is a local no-op, so what is timed is the
  bookkeeping around it), a DistributedDataParallel Linear 8-8 on the CPU, `torch.set_num_threads(1)`.
* A step = forward, `torch.autograd.backward(loss)`. Variants, interleaved per round (order alternating):
  - bare: the step as is;
  - timed: `GradientSyncTimer.begin()` before backward and `.end()` after it, recording into a list — exactly
    what the backward hook adds (hooks.py `_patch_backward`).
* Per variant and round: the median step's CPU time (thread_time_ns: the training thread's own CPU, which other
  processes on a shared machine disturb far less than the wall clock) over N steps; cost = timed − bare per
  round, shown as median [p25, p75] over rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=3000)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stallwatch.torch.ddp_sync import GradientSyncTimer

    torch.set_num_threads(1)
    store = tempfile.mktemp()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    model = DDP(torch.nn.Linear(8, 8))
    x = torch.randn(4, 8)
    events: list[tuple] = []
    timer = GradientSyncTimer(events.append, os.getpid(), lambda: time.time_ns() // 1000)
    timer.found(model)
    recorded: list[tuple] = []

    def record(*e: object) -> None:
        recorded.append(e)
        if len(recorded) > 10_000:
            recorded.clear()

    def bare() -> None:
        loss = model(x).sum()
        torch.autograd.backward(loss)

    def timed() -> None:
        loss = model(x).sum()
        timer.begin((loss,), {})
        torch.autograd.backward(loss)
        timer.end(time.time_ns() // 1000, record)

    def run(step) -> float:
        times = []
        for _ in range(a.steps):
            t = time.thread_time_ns()
            step()
            times.append(time.thread_time_ns() - t)
        return statistics.median(times) / 1000.0

    for _ in range(200):
        bare(), timed()
    diffs, bares, timeds = [], [], []
    for r in range(a.rounds):
        order = (bare, timed) if r % 2 == 0 else (timed, bare)
        got = {f.__name__: run(f) for f in order}
        bares.append(got["bare"])
        timeds.append(got["timed"])
        diffs.append(got["timed"] - got["bare"])
    assert recorded, "the timed variant recorded no exposed all-reduce"
    q = statistics.quantiles(diffs, n=4)
    print(f"{a.rounds} rounds x {a.steps} steps, torch {torch.__version__}")
    print("| variant | median step, CPU µs |\n|---|---:|")
    print(f"| bare | {statistics.median(bares):.1f} |")
    print(f"| timed (ddp_sync) | {statistics.median(timeds):.1f} |")
    print(f"cost per step: {statistics.median(diffs):+.2f} µs [p25 {q[0]:+.2f}, p75 {q[2]:+.2f}]")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
