"""A straggler: two data-parallel ranks (DDP over gloo, on the CPU), one of which gets longer sequences
from an uneven shard, so the other waits for it inside every gradient all-reduce.

    stallwatch run -- python -m torch.distributed.run --nproc-per-node 2 examples/problems/straggler.py
    stallwatch run -- python -m torch.distributed.run --nproc-per-node 2 examples/problems/straggler.py --balanced

It never imports stallwatch. Nothing is downloaded.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--balanced", action="store_true", help="the fix: every rank gets the same work")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    # the uneven shard: the last rank's sequences are 3x as long unless the shards are balanced
    length = 64 if args.balanced or rank != dist.get_world_size() - 1 else 192
    model = DistributedDataParallel(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        batch = torch.randn(32, length, 128)
        optimizer.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"{args.steps} steps on {dist.get_world_size()} ranks, last loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
