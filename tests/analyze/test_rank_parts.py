"""Per rank, the mean step split into data wait, compute, exposed communication and the rest: DDP's exposed
all-reduce (timed inside backward) comes out of compute, a rank without it has none, and the parts add up to the
mean step."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze.rank_parts import COMMUNICATION, COMPUTE, OTHER, exposed_per_step, rank_parts
from stallwatch.analyze.steps import step_stats
from stallwatch.records import COLLECTIVE, DATA_WAIT, DDP_SYNC, EVAL, TRAIN
from tests.analyze.rules._fw_gen import MS, T0, FwGen


def test_the_exposed_sync_comes_out_of_compute_and_the_parts_add_up() -> None:
    gen = FwGen()
    s0, _e0 = gen.steps(rank=0, n=50, step_us=100 * MS, jitter_us=0)
    gen.steps(rank=1, n=50, step_us=100 * MS, jitter_us=0)
    # rank 0 waits 30 ms a step at the end of backward (95 ms after the 5 ms wait: backward ends at 5+28.5+47.5)
    sync_end = s0 + 81 * MS
    gen.events("algo-1", 0, COLLECTIVE, DDP_SYNC, TRAIN, np.arange(50), sync_end - 30 * MS, sync_end)
    gen.steps(rank=0, mode=EVAL, n=10, start_us=T0 + 10**7, jitter_us=0)
    table = gen.table()
    syncs = table.filter(pc.equal(table["name"].cast(pa.string()), DDP_SYNC))
    parts = {p.rank: p for p in rank_parts(step_stats(table), TRAIN, exposed_per_step(syncs), [])}
    r0, r1 = parts[0], parts[1]
    assert r0.communication_from == "timed" and r1.communication_from is None
    assert abs(r0.parts_ms[COMMUNICATION] - 30.0) < 1e-6 and r1.parts_ms[COMMUNICATION] == 0
    assert abs(r0.parts_ms[DATA_WAIT] - 5.0) < 1e-6
    assert abs(r1.parts_ms[COMPUTE] - r0.parts_ms[COMPUTE] - 30.0) < 1e-6  # the same work, less of it compute
    for p in (r0, r1):
        assert abs(sum(p.parts_ms.values()) - p.mean_ms) < 1e-6 and p.parts_ms[OTHER] >= 0
    evals = rank_parts(step_stats(table), EVAL, exposed_per_step(syncs), [])
    assert [p.rank for p in evals] == [0] and evals[0].parts_ms[COMMUNICATION] == 0  # TRAIN's syncs only
