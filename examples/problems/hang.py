"""A hung rank: two data-parallel ranks (DDP over gloo, on the CPU); at step 40 the last rank blocks on a read that
never returns (a stuck network file system, a data loader waiting on a dead worker), so it never reaches the
gradient all-reduce the other rank waits in. Nothing fails: the job just stops making progress.

    stallwatch run --param Hang.floor_s=5 --rule-action Hang=stop_training -- \
        python -m torch.distributed.run --nproc-per-node 2 examples/problems/hang.py
    stallwatch run -- python -m torch.distributed.run --nproc-per-node 2 examples/problems/hang.py --fixed

It never imports stallwatch. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def stuck_read() -> None:
    """A read that never returns (here: an event nobody sets)."""
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--fixed", action="store_true", help="the read returns: every rank keeps stepping")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if step == 40 and rank == dist.get_world_size() - 1 and not args.fixed:
            stuck_read()
        batch = torch.randn(64, 64)
        optimizer.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()  # DDP's all-reduce of the gradients: the other ranks wait here for the hung one
        optimizer.step()
    if rank == 0:
        print(f"{args.steps} steps on {dist.get_world_size()} ranks, last loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
