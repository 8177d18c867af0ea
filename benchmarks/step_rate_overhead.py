"""The job's slowdown under `stallwatch run` across step lengths from 20 µs to 1 s, and what the sampler
process costs meanwhile, against the bare job in paired rounds in one run.

Target (issue 12): <= 2 % slowdown of the job at any step rate.

Run: python benchmarks/step_rate_overhead.py [--rounds N] [--seconds S] [--loop dataloader|optimizer|pairs|scaler]

Method
------
* The job: `for _ in DataLoader(range(N), batch_size=None): model(x); busy(L)` under `no_grad` — the
  DataLoader's `__next__` is the step boundary stallwatch hooks (as in every DataLoader loop), the forward
  of a 1×1 Linear makes it a step (EVAL: a loader loop with no model call is not a training loop), and a
  busy-wait on `perf_counter_ns` makes each step L µs long (the loop's own cost, ~15 µs, is inside L). N is
  chosen so each run lasts about S seconds. The job times its own loop and prints it.
* Variants per step length, interleaved: the bare job; `stallwatch run --report off` (the real sampler, the
  real hooks: steps sampled above 500 steps/s, the default); the same with `--sample-steps-above 0` (every
  step timed: the baseline before sampled steps). Slowdown = median loop time with stallwatch / median bare
  loop time - 1. The sampler's CPU is its own rusage (`sampler_cpu_s` in the node record) over the job's
  duration: % of one core. "timed" is the share of the job's steps recorded individually; every step is
  counted either way (checked: the run's step total equals N).
* "stallwatch's share" is the job's time that was stallwatch's, (stallwatch - bare) / stallwatch; "share it said"
  is what the job measured itself (its hooks' own time in short windows plus its event thread's CPU: the
  `overhead` record behind the summary's note), a lower bound of the former.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, table  # noqa: E402

JOB = '''
import sys, time
import torch
from torch.utils.data import DataLoader
torch.set_num_threads(1)
step_ns, n = int(float(sys.argv[1]) * 1000), int(sys.argv[2])
model, x = torch.nn.Linear(1, 1), torch.ones(1)
clock = time.perf_counter_ns
t0 = clock()
with torch.no_grad():
    for _ in DataLoader(range(n), batch_size=None):
        end = clock() + step_ns
        model(x)
        while clock() < end:
            pass
print("loop_s", (clock() - t0) / 1e9, flush=True)
'''


def _training_job(setup: str, update: str) -> str:
    """A job without DataLoader or marks: a 1×1 Linear's forward and backward, then `update`, and the busy-wait
    making each step L µs (forward, backward and update take ~100 µs here, so steps start there)."""
    body = textwrap.indent(textwrap.dedent(update).strip(), " " * 4)
    return f'''
import sys, time
import torch
torch.set_num_threads(1)
step_ns, n = int(float(sys.argv[1]) * 1000), int(sys.argv[2])
model, x = torch.nn.Linear(1, 1), torch.ones(1)
{setup}
clock = time.perf_counter_ns
t0 = clock()
for _ in range(n):
    end = clock() + step_ns
    loss = model(x).sum()
{body}
    while clock() < end:
        pass
print("loop_s", (clock() - t0) / 1e9, flush=True)
'''


# `--loop optimizer`: steps delimited by optimizer.step() alone (an RL or in-memory loop).
JOB_OPTIMIZER = _training_job("opt = torch.optim.SGD(model.parameters(), lr=1e-6)", """
    opt.zero_grad()
    loss.backward()
    opt.step()
""")
# `--loop pairs`: no optimizer either: forward/backward pairs with a manual update (PyTorch's "learning with
# examples" loops).
JOB_PAIRS = _training_job("", """
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 1e-6 * p.grad
""")
# `--loop scaler`: mixed precision's update: a GradScaler steps the optimizer (and would skip an overflowing one).
JOB_SCALER = _training_job("""opt = torch.optim.SGD(model.parameters(), lr=1e-6)
scaler = torch.amp.GradScaler("cpu")""", """
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
""")
JOBS = {"dataloader": JOB, "optimizer": JOB_OPTIMIZER, "pairs": JOB_PAIRS, "scaler": JOB_SCALER}

FLAGS = {"sampled": [], "every": ["--sample-steps-above", "0"]}  # stallwatch's flags per variant


def run_job(argv: list[str]) -> float:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    return float(next(line.split()[1] for line in p.stdout.splitlines() if line.startswith("loop_s")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--lengths-us", default="20,50,100,1000,10000,100000,1000000")
    ap.add_argument("--variants", default="sampled,every",
                    help="sampled (the default config), every (--sample-steps-above 0), or both")
    ap.add_argument("--loop", choices=tuple(JOBS), default="dataloader",
                    help="what delimits the job's steps: a DataLoader (no_grad forward), optimizer.step() alone, "
                         "forward/backward pairs (a manual update) or a GradScaler's step")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sw-rate-"))
    job = tmp / "job.py"
    job.write_text(JOBS[args.loop])
    rows = []
    for length in [float(x) for x in args.lengths_us.split(",")]:
        n = max(6, int(args.seconds * 1e6 / length))
        variants = [v for v in args.variants.split(",") if v in FLAGS]
        loops: dict[str, list[float]] = {v: [] for v in ["bare", *variants]}
        extra: dict[str, dict[str, list[float]]] = {v: {"sampler": [], "timed": [], "said": []} for v in variants}
        for r in range(args.rounds):
            order = ["bare", *variants] if r % 2 == 0 else [*variants, "bare"]
            for v in order:
                if v == "bare":
                    loops[v].append(run_job([sys.executable, str(job), str(length), str(n)]))
                    continue
                out = tmp / f"run-{length}-{v}-{r}"
                loop = run_job([sys.executable, "-m", "stallwatch", "--quiet", "run", "--report", "off", "--out",
                                str(out), "--node", "n", *FLAGS[v], "--", sys.executable, str(job), str(length),
                                str(n)])
                loops[v].append(loop)
                node = json.loads((out / "nodes" / "n.json").read_text())
                extra[v]["sampler"].append(100 * node.get("sampler_cpu_s", 0) / max(loop, 1e-9))
                from stallwatch.analyze.analysis import RunAnalysis

                analysis = RunAnalysis(str(out))
                timed = analysis.run.framework(kinds=["step"], fields=["step"]).num_rows
                assert analysis.summary.total_steps == n, (v, length, analysis.summary.steps, n)  # all counted
                extra[v]["timed"].append(100 * timed / n)
                extra[v]["said"].append(100 * max((c.share for c in analysis.hook_costs), default=0.0))
        b = statistics.median(loops["bare"])
        for v in variants:
            s = statistics.median(loops[v])
            rows.append([f"{length:g} µs", v, f"{n:,}", f"{b:.2f}", f"{s:.2f}", f"{100 * (s / b - 1):+.1f} %",
                         f"{(s - b) / n * 1e6:+.1f}", f"{statistics.median(extra[v]['said']):.1f} %",
                         f"{statistics.median(extra[v]['sampler']):.1f} %",
                         f"{statistics.median(extra[v]['timed']):.1f} %"])
            print(rows[-1], flush=True)
    print(f"\n{machine()}; {args.rounds} rounds per length; medians\n")
    print(table(["step", "variant", "steps", "bare s", "stallwatch s", "slowdown", "µs per step", "share it said",
                 "sampler CPU", "timed"], rows))


if __name__ == "__main__":
    main()
