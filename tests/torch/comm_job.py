"""A DDP job (gloo on CPU) for the CommunicationBound rule; run by torchrun, never imported:
`comm_job.py OUT_DIR WIDTH BATCH STEPS [WORK_MS]`. A wide model with tiny batches reduces many megabytes of gradients
per step for little computation: communication-bound. A narrow model with WORK_MS of CPU work per step (a loop on the
thread's CPU clock, so a busy machine stretches it as it stretches the rest): compute-bound."""

import json
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

out, width, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
work_s = float(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(steps * 2 * batch, 64), torch.randn(steps * 2 * batch, 1))
loader = DataLoader(data, batch_size=batch, sampler=DistributedSampler(data, shuffle=False))
model = DDP(nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.001)
done = 0
t0 = time.perf_counter()
for xb, yb in loader:
    if work_s:
        until = time.thread_time() + work_s
        while time.thread_time() < until:
            pass
    opt.zero_grad()
    nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
    done += 1
json.dump({"rank": rank, "steps": done, "loop_s": time.perf_counter() - t0},
          open(f"{out}/rank{rank}.json", "w"))
dist.destroy_process_group()
