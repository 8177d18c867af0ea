"""A DDP job (gloo, CPU) where one rank may do extra work every step: the straggler the rule must name. Run by
torchrun, never imported: `straggler_job.py OUT_DIR SLOW_RANK EXTRA_S STEPS [ONSET_STEP [cpu [PROCS]]]` (SLOW_RANK -1:
equal ranks; from ONSET_STEP on, default 0; rank 0 writes the onset's wall time to OUT_DIR/onset.json). With `cpu`
each rank's work (the extra too) is CPU work, 10 ms a step of its thread's CPU clock: a busy or limited CPU
stretches it, as it stretches real compute; with PROCS (a cgroup's `cgroup.procs`), rank 1 moves itself into that
cgroup first thing (a CPU limit on rank 1 alone). Once OUT_DIR/stop exists (the test has seen what it waited for),
rank 0 names a step a few steps ahead in OUT_DIR/stop_at and every rank ends its loop there (the ranks stay within a
step of each other, so each reads it before it gets there)."""

import os

import json
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

out, slow_rank, extra_s, steps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
onset = int(sys.argv[5]) if len(sys.argv) > 5 else 0
cpu_work = len(sys.argv) > 6 and sys.argv[6] == "cpu"
limit_rank_1 = sys.argv[7] if len(sys.argv) > 7 else None
dist.init_process_group("gloo")
rank = dist.get_rank()
if limit_rank_1 and rank == 1:
    with open(limit_rank_1, "w") as procs:
        procs.write(str(os.getpid()))


def work(seconds: float) -> None:
    """`seconds` of this rank's own work: a sleep, or (`cpu`) that much of its thread's CPU time."""
    if not cpu_work:
        time.sleep(seconds)
        return
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


torch.manual_seed(0)
data = TensorDataset(torch.randn(steps * 2 * 8, 64), torch.randn(steps * 2 * 8, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
done = 0
stop_at = None
for xb, yb in loader:
    if rank == 0 and stop_at is None and os.path.exists(f"{out}/stop"):
        stop_at = done + 5
        with open(f"{out}/stop_at.tmp", "w") as f:
            f.write(str(stop_at))
        os.replace(f"{out}/stop_at.tmp", f"{out}/stop_at")
    elif rank != 0 and stop_at is None and os.path.exists(f"{out}/stop_at"):
        with open(f"{out}/stop_at") as f:
            stop_at = int(f.read())
    if done == stop_at:
        break
    if done == onset and rank == 0:
        json.dump({"onset": time.time()}, open(f"{out}/onset.json", "w"))
    if rank == slow_rank and done >= onset:
        work(extra_s)  # this rank's extra work (its data, logging…): the others wait in the all-reduce
    work(0.01)  # every rank's own forward-side work
    opt.zero_grad()
    nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
    done += 1
json.dump({"rank": rank, "steps": done}, open(f"{out}/rank{rank}.json", "w"))
dist.destroy_process_group()
