"""Per-rank phase tracks: the blocks themselves when few, each phase's exact share of every time bucket when many
(zoomed out), DDP's exposed all-reduce as its own block kind, and an answer whose size does not grow with the
events."""

from __future__ import annotations

import json

import numpy as np

from stallwatch.analyze.rank_tracks import rank_tracks
from stallwatch.records import COLLECTIVE, DDP_SYNC, FORWARD, TRAIN
from tests.analyze.rules._fw_gen import MS, T0, FwGen


def _two_ranks(n: int = 20) -> FwGen:
    gen = FwGen()
    gen.steps(rank=0, n=n, step_us=100 * MS, jitter_us=0, gap_us=0)
    gen.steps(rank=1, n=n, step_us=200 * MS, jitter_us=0, gap_us=0)  # the straggler: twice as long
    return gen


def test_few_events_come_as_blocks_per_rank_with_the_ddp_sync_as_its_own_kind() -> None:
    gen = _two_ranks()
    starts = T0 + 100 * MS * np.arange(20) + 90 * MS
    gen.events("algo-1", 0, COLLECTIVE, DDP_SYNC, TRAIN, np.arange(20), starts, starts + 8 * MS)
    gen.events("algo-1", 0, COLLECTIVE, "all_reduce", TRAIN, np.arange(20), starts, starts + 1 * MS)  # not a block
    t = rank_tracks("algo-1", gen.table(), None, None)
    assert not t.aggregated and t.ranks == [0, 1]
    kinds = {(b.rank, b.kind) for b in t.blocks}
    assert (0, DDP_SYNC) in kinds and (1, DDP_SYNC) not in kinds and (0, COLLECTIVE) not in kinds
    sync = [b for b in t.blocks if b.kind == DDP_SYNC]
    assert len(sync) == 20 and all(b.end_us - b.start_us == 8 * MS for b in sync)
    r1_steps = [b for b in t.blocks if b.rank == 1 and b.kind == "step"]
    assert [b.end_us - b.start_us for b in r1_steps] == [200 * MS] * 20
    assert t.total_blocks == sum(1 for b in t.blocks if b.kind != "step")


def test_many_events_come_as_each_phases_exact_share_of_every_bucket() -> None:
    gen = _two_ranks(n=400)  # rank 0: 40 s of steps, rank 1: 80 s
    lo, hi = T0, T0 + 80_000 * MS
    t = rank_tracks("algo-1", gen.table(), lo, hi, limit=100, buckets=40)
    assert t.aggregated and t.bucket_us == 2_000 * MS and t.bucket_start_us == lo
    fwd0, fwd1 = np.array(t.shares[0][FORWARD]), np.array(t.shares[1][FORWARD])
    assert len(fwd0) == len(fwd1) == 40
    # the generator's forward: 30 % of (step - 5 ms data wait) of every step
    assert np.allclose(fwd0[:20], 0.3 * 95 / 100, atol=2e-3) and np.allclose(fwd0[20:], 0)
    assert np.allclose(fwd1, 0.3 * 195 / 200, atol=2e-3)
    assert all(sum(v[j] for v in t.shares[0].values()) <= 1.0 + 1e-3 for j in range(40))
    # the answer is per bucket: ten times the events, the same size
    big = rank_tracks("algo-1", _two_ranks(n=4000).table(), lo, hi, limit=100, buckets=40)
    assert len(json.dumps(big.shares)) < 2 * len(json.dumps(t.shares))


def test_no_step_or_phase_no_tracks() -> None:
    gen = FwGen()
    gen.events("algo-1", 0, COLLECTIVE, "all_reduce", TRAIN, 1, T0, T0 + MS)  # an event, but no block
    t = rank_tracks("algo-1", gen.table(), None, None)
    assert t.ranks == [] and t.blocks == [] and not t.aggregated
