"""Short loops delimited by `optimizer.step()` (26–60 µs steps: a small model, no DataLoader, no marks) under
`stallwatch run`, against the bare job in paired rounds in one run: the job's wall time and its CPU per step.

Target (issue 39): <= 2 % slower (wall and CPU per step) with the default configuration (steps sampled above
500 steps/s: between timed stretches only the step count is kept).

Run: python benchmarks/short_optimizer_steps.py [--rounds N] [--steps N] [--shape tiny|small] [--before SRC]

`--before SRC` adds a third variant, interleaved with the others: `stallwatch run` of the package at SRC (a copy
of `src/` from before a change), so a change is measured against the code it replaces in the same run.

Method
------
* The job: `loss = model(x).sum(); opt.zero_grad(); loss.backward(); opt.step()` over N steps with `torch.set_num_threads(1)`;
  `tiny` is a 1×1 Linear (~30–60 µs a step), `small` a 64→64 Linear on a batch of 8. It times its loop
  (perf_counter) and reports its main thread's CPU (thread_time) and its whole process's CPU (process_time: the
  event thread's included) over the loop.
* Variants, interleaved (the order alternates each round): the bare job; `stallwatch run --report off` (default
  configuration). Medians over the rounds; the run's step total is checked to be N (every step counted).
* `--in-process`: what counting a paused step costs, resolved where the machine's noise hides it end to end: one
  process, the real hooks of a session, blocks of 400 steps alternating between no hooks at all, the paused
  counting of the code before (the optimizer's two global hooks) and the paused counting now (torch's own step
  code), the main thread's CPU per step; every step is checked to be counted by both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, table  # noqa: E402

JOB = '''
import sys, time
import torch
torch.set_num_threads(1)
n, shape = int(sys.argv[1]), sys.argv[2]
if shape == "tiny":
    model, x = torch.nn.Linear(1, 1), torch.ones(1)
else:
    model, x = torch.nn.Linear(64, 64), torch.ones(8, 64)
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
for _ in range(200):  # warm up outside the measured loop (the same for both variants)
    loss = model(x).sum(); opt.zero_grad(); loss.backward(); opt.step()
t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
for _ in range(n):
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loop", time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0, flush=True)
'''


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("loop "))
    wall, cpu, proc = (float(v) for v in line.split()[1:])
    return wall, cpu, proc


def in_process(rounds: int) -> None:
    import time

    import torch

    from stallwatch.config import ProfilerConfig
    from stallwatch.torch.session import Session
    from stallwatch.torch.steps import OPTIMIZER_SOURCE, now_us

    torch.set_num_threads(1)
    model, x = torch.nn.Linear(1, 1), torch.ones(1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    clock = time.thread_time_ns

    def loop(n: int) -> float:
        t = clock()
        for _ in range(n):
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return (clock() - t) / n / 1000

    session = Session(ProfilerConfig(), None, None)
    session.install_hooks()
    hooks, tracker = session.hooks, session.tracker
    loop(300)  # the loop's steps are found and timed

    def pause() -> None:  # as sampling pauses an optimizer-delimited loop
        tracker.source, tracker.counted_optimizer = OPTIMIZER_SOURCE, id(opt)
        tracker.paused_at, tracker.rearmed, tracker.resume_any = now_us(), False, False
        hooks.disarm(keep_optimizer=True)

    switch = hooks._count_in_step_code
    res: dict[str, list[float]] = {"no hooks": [], "paused, two hooks (before)": [], "paused, step code (now)": []}
    for _ in range(rounds):
        hooks._leave_step_code()
        hooks.disarm()
        hooks._remove_optimizer_hooks()
        res["no hooks"].append(loop(400))
        hooks._register_optimizer_hooks()
        hooks._count_in_step_code = lambda _opt: None  # the code before: the hooks stay and count
        pause()
        res["paused, two hooks (before)"].append(loop(400))
        hooks._count_in_step_code = switch
        pause()
        res["paused, step code (now)"].append(loop(400))
        hooks._leave_step_code()
        if not hooks._optim_handles:
            hooks._register_optimizer_hooks()
    assert tracker._marks_paused.get("TRAIN") == rounds * 800, tracker._marks_paused  # every paused step counted
    b = statistics.median(res["no hooks"])
    rows = [[k, f"{statistics.median(v):.2f}", f"{statistics.median(v) - b:+.2f}",
             f"{100 * (statistics.median(v) / b - 1):+.1f} %"] for k, v in res.items()]
    print(f"\n{machine()}; in one process, {rounds} rounds of 3 × 400 steps; medians of the main thread's CPU\n")
    print(table(["variant", "µs per step", "vs no hooks µs", "vs no hooks"], rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=80_000)
    ap.add_argument("--shape", choices=("tiny", "small"), default="tiny")
    ap.add_argument("--before", help="a copy of src/ from before a change: its stallwatch run as a third variant")
    ap.add_argument("--in-process", action="store_true", help="the paused counting's cost, in one process")
    args = ap.parse_args()
    if args.in_process:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
        in_process(args.rounds)
        return
    tmp = Path(tempfile.mkdtemp(prefix="sw-optsteps-"))
    job = tmp / "job.py"
    job.write_text(JOB)
    variants = ["bare", "stallwatch"] + (["before"] if args.before else [])
    got: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    here = str(Path(__file__).resolve().parent.parent / "src")
    for r in range(args.rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            cmd = [sys.executable, str(job), str(args.steps), args.shape]
            env = dict(os.environ)
            if v != "bare":
                out = tmp / f"run-{v}-{r}"
                cmd = [sys.executable, "-m", "stallwatch", "--quiet", "run", "--report", "off", "--out", str(out),
                       "--node", "n", "--", *cmd]
                env["PYTHONPATH"] = os.pathsep.join([args.before if v == "before" else here,
                                                     *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
            got[v].append(run(cmd, env))
            if v != "bare":
                from stallwatch.analyze.analysis import RunAnalysis

                assert RunAnalysis(str(out)).summary.total_steps == args.steps + 200, "not every step counted"
            print(v, r, got[v][-1], flush=True)
    rows = []
    med = {v: [statistics.median(x[i] for x in got[v]) for i in range(3)] for v in got}
    for i, what in enumerate(("wall", "main thread CPU", "process CPU")):
        b = med["bare"][i]
        row = [what, f"{b / args.steps * 1e6:.2f}"]
        for v in variants[1:]:
            s = med[v][i]
            row += [f"{s / args.steps * 1e6:.2f}", f"{100 * (s / b - 1):+.1f} %"]
        rows.append(row)
    print(f"\n{machine()}; shape {args.shape}, {args.steps:,} steps, {args.rounds} rounds; medians\n")
    head = ["per step", "bare µs"]
    for v in variants[1:]:
        head += [f"{v} µs", f"{v} vs bare"]
    print(table(head, rows))
    # Pair by pair (each round's variants ran next to each other): the machine's drift between rounds cancels.
    pairs = []
    for v in variants[1:]:
        for i, what in enumerate(("wall", "main thread CPU")):
            d = sorted(100 * (x[i] / b[i] - 1) for x, b in zip(got[v], got["bare"]))
            pairs.append([v, what, f"{statistics.median(d):+.1f} %", f"{d[0]:+.1f} … {d[-1]:+.1f} %",
                          f"{sum(1 for x in d if x > 0)} of {len(d)}"])
    print()
    print(table(["variant", "per step", "median of pairs", "range", "slower in"], pairs))


if __name__ == "__main__":
    main()
