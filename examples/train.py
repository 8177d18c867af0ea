"""A small real PyTorch training job for the demo: a CNN learning synthetic 28x28 digits on the CPU.

It never imports stallwatch: run it as `stallwatch run -- python examples/train.py`.
Nothing is downloaded; the data set is generated with a learnable pattern per class.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticDigits(Dataset):
    """Each class is a fixed random template plus noise, so the model has something real to learn."""

    def __init__(self, size: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.templates = torch.randn(10, 1, 28, 28, generator=gen)
        self.size = size
        self.seed = seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = int(torch.randint(0, 10, (1,), generator=gen))
        image = self.templates[label] + 1.5 * torch.randn(1, 28, 28, generator=gen)
        return image, label


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=6400)
    parser.add_argument("--eval-size", type=int, default=1280)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # leave a core for the data-loader workers on small machines
    train = DataLoader(SyntheticDigits(args.train_size, seed=1), batch_size=args.batch_size, shuffle=True,
                       num_workers=args.workers, persistent_workers=args.workers > 0)
    evaluate = DataLoader(SyntheticDigits(args.eval_size, seed=2), batch_size=256, num_workers=0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        model.train()
        started = time.perf_counter()
        total = 0.0
        for images, labels in train:
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            total += loss.item()
        model.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in evaluate:
                correct += int((model(images).argmax(dim=1) == labels).sum())
        print(f"epoch {epoch + 1}/{args.epochs}: train loss {total / len(train):.3f}, "
              f"eval accuracy {correct / args.eval_size:.1%}, {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
