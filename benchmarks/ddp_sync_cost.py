"""What timing DDP's exposed gradient all-reduce on every step costs (torch/ddp_sync.py: a hook on the
parameter whose gradient is ready last, and one collective event in the step), in situ and against the same
backward without it.

Target: the hooks' per-step budget, <= 20 µs a timed step in all; this part should be a few µs.

Run: python benchmarks/ddp_sync_cost.py [--rounds R] [--steps N]

Method
------
* One process, a gloo group of one (world_size 1: the all-reduce is a local no-op, so what is measured is the
  bookkeeping around it), a DistributedDataParallel Linear 8-8 on the CPU, `torch.set_num_threads(1)`.
* (1) In situ, the timer's own code per step: `begin()` and `end()` (training thread) and the parameter's hook
  (run by autograd), each wrapped in a perf_counter_ns timer whose own cost (calibrated: an empty timed
  call) is subtracted; median over all steps, and per round.
* (2) What autograd adds to call them (acquiring the interpreter, building the arguments): a tiny graph's backward
  (`(x * 2).sum()`), bare vs on a leaf whose post-accumulate-grad hook reads the clock, in paired rounds (order
  alternating);
  per round the median step's CPU time (thread_time_ns: the training thread's own CPU, far less disturbed by
  other processes than the wall clock); shown as median [p25, p75] of the per-round differences.
* The sum is what the backward hook adds to a DDP step on the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stallwatch.torch import ddp_sync
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
    spent = [0]
    perf = time.perf_counter_ns

    def record(*e: object) -> None:
        recorded.append(e)
        if len(recorded) > 10_000:
            recorded.clear()

    def timed(fn):
        def wrapper(*args):
            t = perf()
            try:
                return fn(*args)
            finally:
                spent[0] += perf() - t
        return wrapper

    empty = timed(lambda: None)
    calib = []
    for _ in range(20_000):
        spent[0] = 0
        empty()
        calib.append(spent[0])
    overhead_ns = statistics.median(calib)  # one timed call's own cost

    # the callbacks autograd calls, timed in place
    timer._last_ready = timed(timer._last_ready)  # type: ignore[method-assign]  (before the hook is placed)
    begin, end = timed(timer.begin), timed(timer.end)
    per_step: list[float] = []
    for i in range(a.rounds * a.steps // 4 + 200):
        loss = model(x).sum()
        spent[0] = 0
        begin((loss,), {})
        torch.autograd.backward(loss)
        end(time.time_ns() // 1000, record)
        if i >= 200:
            per_step.append((spent[0] - 3 * overhead_ns) / 1000.0)
    assert recorded, "the timer recorded no exposed all-reduce"

    # what autograd adds to call a pre-hook and a final callback
    plain, leaf = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    def clock(_p: object) -> None:
        time.time_ns()

    leaf.register_post_accumulate_grad_hook(clock)

    def bare() -> None:
        torch.autograd.backward((plain * 2).sum())

    def hooked() -> None:
        torch.autograd.backward((leaf * 2).sum())

    def run(step) -> float:
        times = []
        for _ in range(a.steps):
            t = time.thread_time_ns()
            step()
            times.append(time.thread_time_ns() - t)
        return statistics.median(times) / 1000.0

    for _ in range(500):
        bare(), hooked()
    diffs, bares = [], []
    for r in range(a.rounds):
        order = (bare, hooked) if r % 2 == 0 else (hooked, bare)
        got = {f.__name__: run(f) for f in order}
        bares.append(got["bare"])
        diffs.append(got["hooked"] - got["bare"])
    q = statistics.quantiles(diffs, n=4)
    body = statistics.quantiles(per_step, n=4)
    print(f"torch {torch.__version__}, {len(per_step)} DDP steps in situ; {a.rounds} rounds x {a.steps} tiny backwards")
    print(f"(1) the timer's own code per step: median {statistics.median(per_step):.2f} µs "
          f"[p25 {body[0]:.2f}, p75 {body[2]:.2f}] (timer cost {overhead_ns:.0f} ns a call, subtracted)")
    print(f"(2) autograd calling the parameter's hook: {statistics.median(diffs):+.2f} µs "
          f"[p25 {q[0]:+.2f}, p75 {q[2]:+.2f}] on a {statistics.median(bares):.1f} µs backward")
    dist.destroy_process_group()
    del ddp_sync


if __name__ == "__main__":
    main()
