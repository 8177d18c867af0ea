"""The fixed cost of `stallwatch run` per job: how much later the job's first line of output appears, and how
much later `stallwatch run` returns the job's exit status after the job ended, against the bare job, in
paired rounds in one run.

Targets (issue 12): <= 0.5 s added before the job's first line and before the exit status returns.

Run: python benchmarks/run_fixed_cost.py [--rounds N]

Method
------
* The job is a real tiny PyTorch training run (20 steps of a linear model, DataLoader over a tensor). It
  prints the wall-clock time as its very first statement (before importing torch), and again as its last.
* Variants, interleaved in rounds (each round starts with another one): the bare job; `stallwatch run`
  with its output not on a terminal (so the default, `--report auto`, builds the report before it returns,
  as for scripts, CI, schedulers and containers started for the job); `stallwatch run --report background`
  (what `auto` does for a person at a terminal: report.html is a page that reloads itself and a detached
  process builds the report; its CPU is not counted here, it runs after the job).
* Per run: first-line delay = the job's first timestamp - the moment the command was started; after-job
  time = the moment the command returned - the job's last timestamp; wall; CPU of the command and its
  children (rusage). Medians over rounds, and the difference to the bare job's medians.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, table  # noqa: E402

JOB = '''
import time
print("first", time.time(), flush=True)
import torch
torch.set_num_threads(1)
m = torch.nn.Linear(16, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for xb in torch.utils.data.DataLoader(torch.randn(80, 16), batch_size=4):
    opt.zero_grad(); m(xb).sum().backward(); opt.step()
print("last", time.time(), flush=True)
'''


def one(argv: list[str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=300)
    t1 = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert p.returncode == 0, p.stdout
    stamps = dict(line.split() for line in p.stdout.splitlines() if line.startswith(("first", "last")))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"first": float(stamps["first"]) - t0, "after": t1 - float(stamps["last"]), "wall": t1 - t0, "cpu": cpu}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sw-fixed-"))
    job = tmp / "tiny.py"
    job.write_text(JOB)
    sw = [sys.executable, "-m", "stallwatch", "--quiet", "run"]
    variants = {
        "bare job": lambda i: [sys.executable, str(job)],
        "stallwatch run (default, no terminal: waits)": lambda i: [
            *sw, "--out", str(tmp / f"w{i}"), "--", sys.executable, str(job)],
        "stallwatch run --report background (= auto at a terminal)": lambda i: [
            *sw, "--report", "background", "--out", str(tmp / f"b{i}"), "--", sys.executable, str(job)],
    }
    names = list(variants)
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    one(variants["bare job"](-1))  # warm the page cache: torch's files
    for r in range(args.rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            results[name].append(one(variants[name](r)))
        time.sleep(3)  # the detached report of this round finishes outside the next round
    med = {n: {m: statistics.median(x[m] for x in results[n]) for m in ("first", "after", "wall", "cpu")}
           for n in names}
    base = med["bare job"]
    rows = []
    for n in names:
        m = med[n]
        d = {k: m[k] - base[k] for k in m}
        rows.append([n, f"{m['first']:.2f}", f"{m['after']:.2f}", f"{m['wall']:.2f}", f"{m['cpu']:.2f}",
                     "–" if n == "bare job" else f"+{d['first']:.2f}",
                     "–" if n == "bare job" else f"+{d['after']:.2f}",
                     "–" if n == "bare job" else f"{m['cpu'] / base['cpu']:.2f}×"])
    print(f"{machine()}; {args.rounds} rounds; medians, seconds\n")
    print(table(["variant", "first line", "after job", "wall", "CPU", "Δ first line", "Δ after job", "CPU ×"], rows))
    print(f"\nfiles: {tmp}")
    os.system(f"rm -rf {tmp}")


if __name__ == "__main__":
    main()
