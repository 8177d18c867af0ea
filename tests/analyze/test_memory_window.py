"""The job's memory per rank on one time grid: each bucket the highest reading in it (a spike survives
thinning), the previous reading carried over a bucket without a step, nothing before a rank's first step."""

from __future__ import annotations

import json

from stallwatch.analyze.memory_window import memory_window
from stallwatch.records import STEP, TRAIN
from tests.analyze.rules._fw_gen import MS, T0, FwGen


def test_memory_per_rank_on_one_grid_with_peaks_kept() -> None:
    gen = FwGen()
    for i in range(100):
        rss = 1024 * (500 if i == 37 else 100 + i)  # KiB; a spike at step 37
        gen.events("algo-1", 0, STEP, "train_step", TRAIN, i, T0 + i * 100 * MS, T0 + i * 100 * MS + 90 * MS,
                   json.dumps({"rss_kb": rss, "cuda_alloc_kb": 2048}))
    for i in range(50, 100):  # rank 1 starts half way, RSS only
        gen.events("algo-1", 1, STEP, "train_step", TRAIN, i, T0 + i * 100 * MS, T0 + i * 100 * MS + 95 * MS,
                   json.dumps({"rss_kb": 1024 * 300}))
    w = memory_window(gen.table(), points=20)
    assert len(w.ts) == 20 and w.ts == sorted(w.ts)
    series = {(s.rank, s.field): s.mb for s in w.series}
    assert set(series) == {(0, "rss_kb"), (0, "cuda_alloc_kb"), (1, "rss_kb")}
    assert max(v for v in series[(0, "rss_kb")] if v is not None) == 500.0  # the spike, not a bucket's mean
    assert series[(0, "cuda_alloc_kb")] == [2.0] * 20
    r1 = series[(1, "rss_kb")]
    assert r1[:9] == [None] * 9 and r1[-1] == 300.0 and None not in r1[10:]


def test_steps_without_memory_give_no_series() -> None:
    gen = FwGen()
    gen.steps(n=10)
    assert memory_window(gen.table()).series == []
