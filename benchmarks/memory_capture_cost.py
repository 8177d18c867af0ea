"""What the automatic memory capture (torch/memory_capture.py) costs the job: the steps it covers run with
tracemalloc tracing and a TorchFunctionMode recording where tensors are made, and it takes two heap snapshots
and a diff. A small CPU training loop (MLP, batch 64) times its steps without a capture and inside one, in
interleaved rounds, on a small Python heap and on one holding a million extra objects (snapshots grow with the
heap). Prints a table (docs/benchmarks.md). `python benchmarks/memory_capture_cost.py [ROUNDS]`."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from stallwatch.torch.memory_capture import STEPS, MemoryCapture


def _loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _round(step, capture: bool) -> tuple[float, float, float]:
    """(ms per step over the 1 + STEPS steps, ms of the capture's own calls (start, snapshots, stop), the capture's
    own cost_ms as it records it)."""
    cap = MemoryCapture(lambda e: None, 1) if capture else None
    t_bound = 0.0
    if cap is not None:
        t0 = time.perf_counter()
        cap.start(0)
        t_bound += time.perf_counter() - t0
    t_steps = 0.0
    for _ in range(1 + STEPS):
        if cap is not None:  # the snapshots: counted in the capture's own cost, not in the steps'
            t0 = time.perf_counter()
            cap.next_step()
            t_bound += time.perf_counter() - t0
        t0 = time.perf_counter()
        step()
        t_steps += time.perf_counter() - t0
    cost = 0.0
    if cap is not None:
        t0 = time.perf_counter()
        cap.stop("")
        t_bound += time.perf_counter() - t0
        cost = cap.meta["cost_ms"]
    return t_steps * 1000 / (1 + STEPS), t_bound * 1000, cost


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    step = _loop()
    for _ in range(20):
        step()
    print(f"{rounds} rounds, {1 + STEPS} steps each, torch {torch.__version__}, Python {sys.version.split()[0]}")
    print("| heap | step ms, no capture | step ms, in a capture | capture's calls ms (start, snapshots, stop) | "
          "its recorded cost_ms |")
    print("|---|---|---|---|---|")
    ballast: list = []
    for label in ("small (this script)", "+1,000,000 objects kept by each step"):
        if label.startswith("+"):  # a job whose steps allocate a lot of Python objects: all traced
            def step(real=step) -> None:
                real()
                ballast.append([{"i": i} for i in range(1_000_000 // (1 + STEPS))])
                del ballast[:-1]
        off, on, bounds, costs = [], [], [], []
        for _ in range(rounds):
            off.append(_round(step, False)[0])
            ms, bound, cost = _round(step, True)
            on.append(ms)
            bounds.append(bound)
            costs.append(cost)
        print(f"| {label} | {statistics.median(off):.2f} | {statistics.median(on):.2f} | "
              f"{statistics.median(bounds):.1f} | {statistics.median(costs):.1f} |")


if __name__ == "__main__":
    main()
