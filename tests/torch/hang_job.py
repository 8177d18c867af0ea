"""Ranks over gloo (CPU) training a tiny model, each step ending with an explicit all-reduce of the loss. Run by
torchrun, never imported: `hang_job.py OUT_DIR HANG_RANK HANG_STEP STEPS STEP_S`. At step HANG_STEP rank
HANG_RANK stops before the all-reduce (sleeps for an hour: the planted hang; -1: none) and writes the moment
to OUT_DIR/onset.json; the other ranks wait inside the all-reduce. STEP_S: each step's own work (sleep)."""

import json
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

out, hang_rank, hang_step, steps, step_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    float(sys.argv[5])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
loader = DataLoader(TensorDataset(torch.randn(steps * 4, 16), torch.randn(steps * 4, 1)), batch_size=4)
model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (xb, yb) in enumerate(loader):
    time.sleep(step_s)
    loss = nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == hang_rank and step == hang_step:
        with open(f"{out}/onset.json", "w") as f:
            json.dump({"onset": time.time()}, f)
        time.sleep(3600)  # the planted hang: this rank never reaches the all-reduce below
    dist.all_reduce(loss.detach())
dist.destroy_process_group()
