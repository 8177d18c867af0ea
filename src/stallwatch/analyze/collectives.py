"""Gradient synchronisation of DistributedDataParallel per step: DDP runs its all-reduce inside backward, where
no Python call can time it, and samples its own timing (the first iterations, then every 100th). From those
samples: the all-reduce time per step, the part hidden behind backward's computation, and the exposed part the
step waits for — estimates, said as such, scaled to the rank's training steps."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

DDP_EVENT = "ddp_gradient_all_reduce"


@dataclass(frozen=True)
class GradientSync:
    """One rank's DDP gradient all-reduce, per training step (DDP's averages over its sampled iterations)."""
    node: str
    rank: int
    samples: int  # DDP's sampled iterations read
    comm_ms: float  # all-reduce time per step
    overlap_ms: float  # of which ran while backward was still computing
    backward_ms: float  # backward's computation per step
    train_steps: int

    @property
    def exposed_ms(self) -> float:
        """What the step waited for: all-reduce time not hidden behind backward."""
        return max(self.comm_ms - self.overlap_ms, 0.0)

    @property
    def overlap_pct(self) -> float:
        return 100.0 * self.overlap_ms / self.comm_ms if self.comm_ms > 0 else 0.0

    @property
    def exposed_total_s(self) -> float:
        return self.exposed_ms * self.train_steps / 1e3

    @property
    def comm_total_s(self) -> float:
        return self.comm_ms * self.train_steps / 1e3


def gradient_sync(samples: pa.Table, train_steps: dict[tuple[str, int], int]) -> list[GradientSync]:
    """`samples`: the `ddp_gradient_all_reduce` collective events (node, rank, args); `train_steps`: TRAIN steps
    per (node, rank). The newest sample carries DDP's running averages."""
    newest: dict[tuple[str, int], tuple[int, dict]] = {}
    counts: dict[tuple[str, int], int] = {}
    for row in samples.select(["node", "rank", "start_us", "args"]).to_pylist():
        key = (str(row["node"]), int(row["rank"]))
        try:
            args = json.loads(row["args"] or "{}")
        except ValueError:
            continue
        if not isinstance(args, dict):
            continue
        counts[key] = counts.get(key, 0) + 1
        if key not in newest or row["start_us"] >= newest[key][0]:
            newest[key] = (row["start_us"], args)
    out = []
    for key in sorted(newest):
        sample = averages(newest[key][1])
        if sample is None:
            continue
        comm, overlap, backward = sample
        out.append(GradientSync(node=key[0], rank=key[1], samples=counts[key], comm_ms=comm, overlap_ms=overlap,
                                backward_ms=backward, train_steps=train_steps.get(key, 0)))
    return out


def averages(args: dict) -> tuple[float, float, float] | None:
    """DDP's running averages in one sample's args, ms: (all-reduce, of which overlapping backward, backward's
    computation); None when the sample has no all-reduce time."""
    comm, overlap, backward = (_ms(args.get(k)) for k in (
        "avg_backward_comm_time_us", "avg_backward_compute_comm_overlap_time_us", "avg_backward_compute_time_us"))
    if comm is None:
        return None
    return comm, min(overlap or 0.0, comm), backward or 0.0


def _ms(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value) / 1e3
    return None
