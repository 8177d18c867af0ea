"""On a CUDA machine: what stallwatch measures of a GPU-bound training loop, against the loop's own clocks and
nvidia-smi (docs/accuracy.md, "On a real GPU"). CI has no GPU; this is run by hand where one is lent.

    python benchmarks/gpu_steps.py run DIR [--steps 200] [--pairs 2]   # needs CUDA and nvidia-smi: writes DIR
    python benchmarks/gpu_steps.py compare DIR                        # anywhere: the tables

`run` trains the loop below bare and under `stallwatch run --interval 100ms`, alternating (`--pairs` of each, with a
`loss.item()` every step, then one profiled run with no sync in the loop), while nvidia-smi logs every 100 ms.
The loop times each iteration on the host and each phase with CUDA events, into DIR/<name>.json. `compare` prints
the loop's wall time bare and profiled (the slowdown), stallwatch's step p50 and phase split against the script's
iteration time and CUDA-event phases, and each NVML metric against nvidia-smi's nearest line.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table  # noqa: E402

LOOP = '''
import json, sys, time
import torch
from torch import nn
out, steps, sync_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(4096, 4096), nn.GELU()) for _ in range(8)],
                      nn.Linear(4096, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x, y = torch.randn(4096, 4096, device="cuda"), torch.randint(0, 10, (4096,), device="cuda")
events = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(steps)]
host = []
torch.cuda.synchronize()
begin = time.time()
for i in range(steps):
    e = events[i]
    top = time.perf_counter()
    e[0].record()
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    e[1].record()
    loss.backward()
    e[2].record()
    opt.step()
    e[3].record()
    if sync_every and i % sync_every == 0:
        loss.item()
    host.append(top)
torch.cuda.synchronize()
end = time.time()
json.dump({"begin": begin, "end": end, "tops": host, "sync_every": sync_every,
           "gpu_ms": [[e[0].elapsed_time(e[1]), e[1].elapsed_time(e[2]), e[2].elapsed_time(e[3])] for e in events]},
          open(out, "w"))
'''
SMI_FIELDS = "timestamp,utilization.gpu,memory.used,power.draw"


def run(out: Path, steps: int, pairs: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    script = out / "loop.py"
    script.write_text(LOOP)
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,nounits", "-lms", "100"],
                           stdout=open(out / "smi.csv", "w"))
    profiled = [sys.executable, "-m", "stallwatch", "run", "--interval", "100ms", "--report", "off", "--out"]
    try:
        for k in range(1, pairs + 1):
            subprocess.run([sys.executable, str(script), str(out / f"bare{k}.json"), str(steps), "1"], check=True)
            subprocess.run([*profiled, str(out / f"prof{k}"), "--", sys.executable, str(script),
                            str(out / f"prof{k}.json"), str(steps), "1"], check=True)
        subprocess.run([*profiled, str(out / "nosync"), "--", sys.executable, str(script),
                        str(out / "nosync.json"), str(steps), "0"], check=True)
    finally:
        smi.terminate()


def _loop(path: Path) -> dict:
    d = json.loads(path.read_text())
    tops = d["tops"]
    gpu = np.array(d["gpu_ms"])
    return {"wall_s": d["end"] - d["begin"], "iteration_ms": 1000 * statistics.median(np.diff(tops)),
            "gpu_ms": [float(np.median(gpu[:, i])) for i in range(3)]}


def _stallwatch(run_dir: Path) -> tuple[float, dict[str, float]]:
    from stallwatch.analyze.analysis import RunAnalysis

    (stat,) = [s for s in RunAnalysis(str(run_dir)).step_stats() if s.mode == "TRAIN"]
    return stat.p50_ms, dict(stat.phase_pct)


def _nvidia_smi(path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rows = list(csv.reader(path.open()))[1:]
    ts = np.array([dt.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc)
                   .timestamp() * 1e6 for r in rows])
    return ts, {"gpu_util": np.array([float(r[1]) for r in rows]),
                "gpu_mem_used_bytes": np.array([float(r[2]) for r in rows]) * 2**20,
                "gpu_power_w": np.array([float(r[3]) for r in rows])}


def compare(out: Path) -> None:
    import stallwatch

    names = sorted(p.stem for p in out.glob("*.json"))
    print(f"The loop on its own clocks ({out})")
    rows = []
    for name in names:
        loop = _loop(out / f"{name}.json")
        p50, phases = _stallwatch(out / name) if (out / name).is_dir() else (None, {})
        split = " / ".join(f"{phases.get(k, 0):.0f}" for k in ("forward", "backward", "optimizer"))
        rows.append([name, f"{loop['wall_s']:.2f} s", f"{loop['iteration_ms']:.1f}",
                     " / ".join(f"{v:.1f}" for v in loop["gpu_ms"]),
                     f"{p50:.1f}" if p50 is not None else "-",
                     f"{split} / {100 - sum(phases.values()):.0f}" if phases else "-"])
    print(table(["run", "loop wall", "iteration p50 ms", "CUDA events fwd / bwd / opt ms",
                 "stallwatch step p50 ms", "stallwatch fwd / bwd / opt / other %"], rows))
    if not (out / "smi.csv").exists():
        return
    ts, smi = _nvidia_smi(out / "smi.csv")
    rows = []
    for name in names:
        if not (out / name).is_dir():
            continue
        t = stallwatch.open_run(str(out / name)).system(metrics=list(smi)).to_pydict()
        metric, when, value = np.array(t["metric"]), np.array(t["timestamp_us"]), np.array(t["value"])
        for m, ref in smi.items():
            mine = metric == m
            at = np.clip(np.searchsorted(ts, when[mine]), 1, len(ts) - 1)
            nearest = np.where(np.abs(ts[at - 1] - when[mine]) < np.abs(ts[at] - when[mine]), at - 1, at)
            diff = np.abs(value[mine] - ref[nearest])
            unit = 2**20 if m == "gpu_mem_used_bytes" else 1
            apart_ms = np.max(np.abs(ts[nearest] - when[mine])) / 1e3
            rows.append([name, m, str(int(mine.sum())), f"{np.median(diff) / unit:.2f}",
                         f"{np.percentile(diff, 95) / unit:.2f}", f"{apart_ms:.0f}"])
    print("\nNVML through stallwatch against nvidia-smi's nearest line (memory in MiB)")
    print(table(["run", "metric", "snapshots", "|difference| p50", "p95", "farthest line ms"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="train and profile the loop (needs CUDA and nvidia-smi)")
    r.add_argument("out", type=Path)
    r.add_argument("--steps", type=int, default=200)
    r.add_argument("--pairs", type=int, default=2)
    c = sub.add_parser("compare", help="the tables, from what `run` wrote")
    c.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.what == "run":
        run(args.out, args.steps, args.pairs)
    compare(args.out)


if __name__ == "__main__":
    main()
