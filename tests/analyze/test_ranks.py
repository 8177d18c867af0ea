"""The rank × step matrices: every rank's step N in the same column, mean step time per cell, and the share of
step time spent waiting for data, from generated events with a planted slow rank and a planted starved rank."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from stallwatch.analyze.ranks import rank_steps
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.records import DATA_WAIT, EVAL, STEP, TRAIN
from tests.analyze.rules._fw_gen import MS, FwGen


def _columns(table, kind):
    return FrameworkColumns(table.filter(pc.equal(table["kind"], kind)))


def _planted():
    """Three ranks × 1,000 TRAIN steps of 100 ms (± 0); algo-2/1 steps take 150 ms from step 400 to 599;
    algo-1/1 waits 60 ms for every batch, the others 5 ms; plus 50 EVAL steps on rank 0."""
    gen = FwGen()
    gen.steps(node="algo-1", rank=0, n=1000, jitter_us=0)
    gen.steps(node="algo-1", rank=1, n=1000, jitter_us=0, data_wait_us=60 * MS)
    gen.steps(node="algo-2", rank=1, n=1000, jitter_us=0, slow={i: 150 * MS for i in range(400, 600)})
    gen.steps(node="algo-1", rank=0, mode=EVAL, n=50, jitter_us=0, start_us=10**16)
    table = gen.table()
    return _columns(table, STEP), _columns(table, DATA_WAIT)


def test_one_row_per_rank_one_column_per_step_bucket():
    steps, waits = _planted()
    m = rank_steps(steps, waits, mode=TRAIN, max_columns=100)
    assert m is not None and m.ranks == ["algo-1/0", "algo-1/1", "algo-2/1"] and m.ranks_total == 3
    assert (m.first_step, m.steps_per_column, m.columns) == (0, 10, 100)
    assert np.allclose(m.step_ms[0], 100.0) and np.allclose(m.step_ms[1], 100.0)
    slow = m.step_ms[2]
    assert np.allclose(slow[40:60], 150.0) and np.allclose(slow[:40], 100.0) and np.allclose(slow[60:], 100.0)


def test_data_wait_share_per_cell():
    steps, waits = _planted()
    m = rank_steps(steps, waits, mode=TRAIN, max_columns=100)
    assert m.wait_pct is not None
    assert np.allclose(m.wait_pct[1], 60.0) and np.allclose(m.wait_pct[0], 5.0)
    assert np.allclose(m.wait_pct[2][40:60], 100 * 5 / 150)


def test_every_step_its_own_column_when_few_and_other_modes_apart():
    steps, waits = _planted()
    m = rank_steps(steps, waits, mode=EVAL)
    assert m.ranks == ["algo-1/0"] and (m.steps_per_column, m.columns) == (1, 50)
    assert rank_steps(steps, None, mode="GLOBAL") is None
    assert rank_steps(steps, None, mode=TRAIN).wait_pct is None
