"""An idle GPU: the training process augments every batch on the CPU and reads the loss back after every
step, so the GPU waits for the host between short bursts of work.

    stallwatch run -- python examples/problems/gpu_idle.py            # the problem
    stallwatch run -- python examples/problems/gpu_idle.py --fixed    # augment on the device, sync rarely

Runs on the first CUDA GPU when there is one, else on the CPU (where there is no GPU to idle: the GPU
rules then say "not applicable"). It never imports stallwatch. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def augment(images: torch.Tensor) -> torch.Tensor:
    """Random flips and a blur: cheap on the device, slow one image at a time in Python on the host."""
    out = []
    for image in images:
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        out.append(nn.functional.avg_pool2d(image[None], 3, stride=1, padding=1)[0])
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fixed", action="store_true", help="batch augmentation on the device, loss read every 50 steps")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    started = time.perf_counter()
    for step in range(args.steps):
        images = torch.randn(args.batch_size, 3, 64, 64)
        labels = torch.randint(0, 10, (args.batch_size,))
        if args.fixed:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            flip = torch.rand(args.batch_size, 1, 1, 1, device=device) < 0.5
            images = nn.functional.avg_pool2d(torch.where(flip, images.flip(-1), images), 3, stride=1, padding=1)
        else:
            images, labels = augment(images).to(device), labels.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        if not args.fixed or step % 50 == 0:
            last = loss.item()  # a host-device sync
    print(f"{args.steps} steps on {device} in {time.perf_counter() - started:.1f} s, loss {last:.3f}")


if __name__ == "__main__":
    main()
