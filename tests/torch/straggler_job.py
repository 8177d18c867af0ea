"""A DDP job (gloo, CPU) where one rank may do extra work every step: the straggler the rule must name. Run by
torchrun, never imported: `straggler_job.py OUT_DIR SLOW_RANK EXTRA_S STEPS [ONSET_STEP]` (SLOW_RANK -1: equal
ranks; from ONSET_STEP on, default 0; rank 0 writes the onset's wall time to OUT_DIR/onset.json)."""

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
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(steps * 2 * 8, 64), torch.randn(steps * 2 * 8, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
done = 0
for xb, yb in loader:
    if done == onset and rank == 0:
        json.dump({"onset": time.time()}, open(f"{out}/onset.json", "w"))
    if rank == slow_rank and done >= onset:
        time.sleep(extra_s)  # this rank's extra work (its data, logging…): the others wait in the all-reduce
    time.sleep(0.01)  # every rank's own forward-side work
    opt.zero_grad()
    nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
    done += 1
json.dump({"rank": rank, "steps": done}, open(f"{out}/rank{rank}.json", "w"))
dist.destroy_process_group()
