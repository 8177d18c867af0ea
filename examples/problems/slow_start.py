"""A slow start: the job prepares its data set in pure Python before the first step, every time it starts.

    stallwatch run -- python examples/problems/slow_start.py                        # the problem
    stallwatch run -- python examples/problems/slow_start.py --cache prepared.pt    # the fix: prepare once

The second command's first run still prepares (and writes the cache); every later start loads it in
milliseconds. It never imports stallwatch. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

import torch
from torch import nn


def prepare(records: int) -> torch.Tensor:
    """Tokenise synthetic text records into hashed features: minutes on a real corpus, seconds here."""
    rows = []
    for i in range(records):
        text = f"record {i} " + " ".join(f"word{(i * 7 + j) % 997}" for j in range(24))
        tokens = [int(hashlib.blake2b(w.encode(), digest_size=4).hexdigest(), 16) % 4096 for w in text.split()]
        row = [0.0] * 64
        for t in tokens:
            row[t % 64] += 1.0
        rows.append(row)
    return torch.tensor(rows)


def load(records: int, cache: Path | None) -> torch.Tensor:
    if cache is not None and cache.is_file():
        return torch.load(cache)
    data = prepare(records)
    if cache is not None:
        torch.save(data, cache)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--cache", type=Path, default=None, help="keep the prepared data set here (the fix)")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    started = time.perf_counter()
    data = load(args.records, args.cache)
    print(f"data ready after {time.perf_counter() - started:.1f} s", flush=True)
    labels = (data[:, 0] > data[:, 0].median()).long()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        index = torch.randint(0, len(data), (256,))
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(data[index]), labels[index])
        loss.backward()
        optimizer.step()
    print(f"{args.steps} steps, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
