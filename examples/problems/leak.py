"""A memory leak: the loop keeps every step's output (and, through it, the step's autograd graph) in a list, as a
"keep the predictions for later" or a `losses.append(loss)` does. Memory grows with every step until the job
runs out.

    stallwatch run --memory-profiling 500:6 -- python examples/problems/leak.py          # the problem, named
    stallwatch run -- python examples/problems/leak.py --fixed                         # the fix: keep a number

It never imports stallwatch. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--fixed", action="store_true", help="keep the loss as a number, not the output")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(64, 1024)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    kept: list = []
    for _ in range(args.steps):
        x = torch.randn(32, 64)
        out = model(x)
        loss = out.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.fixed:
            kept.append(loss.item())  # a number: nothing of the step stays alive
        else:
            kept.append(out)  # the leak: 128 KiB of output a step, and its graph
        time.sleep(0.002)
    print(f"{args.steps} steps, kept {len(kept)} results")


if __name__ == "__main__":
    main()
