"""An input-bound job: each sample is read from slow storage (2 ms, like a network file system) in the
training process itself, so the model waits for every batch.

    stallwatch run -- python examples/problems/input_bound.py              # the problem: num_workers=0
    stallwatch run -- python examples/problems/input_bound.py --workers 8  # the fix: reads overlap training

It never imports stallwatch. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowStorage(Dataset):
    """Samples behind a fixed read latency, then a small decode: what a remote file system costs per file."""

    def __init__(self, size: int, read_ms: float) -> None:
        self.size, self.read_s = size, read_ms / 1000

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.read_s)  # the read: the process waits, the CPU does not work
        gen = torch.Generator().manual_seed(index)
        label = index % 10
        image = torch.randn(3, 32, 32, generator=gen) + label / 10
        return image, label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (the fix: 8)")
    parser.add_argument("--samples", type=int, default=2400)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--read-ms", type=float, default=2.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(SlowStorage(args.samples, args.read_ms), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, prefetch_factor=4 if args.workers else None)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                          nn.Flatten(), nn.Linear(64 * 16, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    started = time.perf_counter()
    for images, labels in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
    steps = len(loader)
    elapsed = time.perf_counter() - started
    print(f"{steps} steps in {elapsed:.1f} s ({1000 * elapsed / steps:.0f} ms per step), last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
