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
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=80_000)
    ap.add_argument("--shape", choices=("tiny", "small"), default="tiny")
    ap.add_argument("--before", help="a copy of src/ from before a change: its stallwatch run as a third variant")
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
