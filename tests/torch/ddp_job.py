"""A two-rank DDP job on CPU (gloo) for the distributed test; run by torchrun, never imported."""

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
sampler = DistributedSampler(data, shuffle=False)
loader = DataLoader(data, batch_size=4, sampler=sampler)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 0
for epoch in range(2):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        steps += 1
    total = torch.tensor([float(steps)])
    dist.all_reduce(total)  # an explicit collective, outside the steps
dist.barrier()
json.dump({"rank": rank, "steps": steps}, open(f"{sys.argv[1]}/rank{rank}.json", "w"))
dist.destroy_process_group()
