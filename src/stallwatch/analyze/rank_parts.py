"""Per rank, where its typical step went — waiting for data, computing, waiting for communication (the exposed
part of DDP's gradient all-reduce), the rest — in ms per step, so a straggler (one long bar) and a
communication-bound job (a tall communication part everywhere) read off one stacked chart."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from stallwatch.analyze.collectives import GradientSync
from stallwatch.analyze.steps import StepStat
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, OPTIMIZER, TRAIN

COMPUTE, OTHER = "compute", "other"
COMMUNICATION = COLLECTIVE  # the catalogue's "collectives": its label and colour
PARTS = (DATA_WAIT, COMPUTE, COMMUNICATION, OTHER)


@dataclass(frozen=True)
class RankParts:
    node: str
    rank: int
    mode: str
    steps: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    parts_ms: dict[str, float] = field(default_factory=dict)  # per step, PARTS; they sum to mean_ms
    communication_from: str | None = None  # "timed" (host-timed syncs), "sampled" (DDP's averages) or None


def exposed_per_step(syncs: pa.Table) -> dict[tuple[str, int], tuple[float, int]]:
    """Per (node, rank): the exposed all-reduce µs summed over the timed syncs, and how many (DDP_SYNC events)."""
    out: dict[tuple[str, int], tuple[float, int]] = {}
    if not syncs.num_rows:
        return out
    node = syncs["node"].cast(pa.string()).to_numpy(zero_copy_only=False).astype(object)
    rank = syncs["rank"].to_numpy(zero_copy_only=False).astype(np.int64)
    dur = (syncs["end_us"].to_numpy(zero_copy_only=False) - syncs["start_us"].to_numpy(zero_copy_only=False))
    for key in {(str(n), int(r)) for n, r in zip(node, rank)}:
        mine = (node == key[0]) & (rank == key[1])
        out[key] = (float(dur[mine].sum()), int(mine.sum()))
    return out


def rank_parts(stats: list[StepStat], mode: str, timed: dict[tuple[str, int], tuple[float, int]],
               sampled: list[GradientSync]) -> list[RankParts]:
    """`stats`: step statistics per rank and mode; `timed`: `exposed_per_step` of the DDP_SYNC events (their
    time is inside backward's, so it is taken out of the compute part); `sampled`: DDP's own averages, used for
    a rank without timed syncs (CUDA). Communication is TRAIN's alone."""
    by_rank = {(g.node, g.rank): g for g in sampled}
    out = []
    for s in stats:
        if s.mode != mode or s.steps == 0:
            continue
        mean = s.mean_ms or s.p50_ms
        pct = s.phase_pct
        wait = mean * pct.get(DATA_WAIT, 0.0) / 100
        compute = mean * sum(pct.get(p, 0.0) for p in (FORWARD, BACKWARD, OPTIMIZER)) / 100
        comm, source = 0.0, None
        key = (s.node, s.rank)
        if mode == TRAIN and key in timed and timed[key][1]:
            comm, source = timed[key][0] / 1000 / s.steps, "timed"  # inside backward: out of compute
            comm = min(comm, compute)
            compute -= comm
        elif mode == TRAIN and key in by_rank:  # CUDA: the GPU's wait, within its backward's time too
            comm, source = min(by_rank[key].exposed_ms, compute), "sampled"
            compute -= comm
        other = max(mean - wait - compute - comm, 0.0)
        out.append(RankParts(s.node, s.rank, mode, s.steps, mean, s.p50_ms, s.p95_ms,
                             {DATA_WAIT: wait, COMPUTE: compute, COMMUNICATION: comm, OTHER: other}, source))
    return out
