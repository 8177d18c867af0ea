"""stallwatch.keras.ProfilerCallback passed by the job itself, without `stallwatch run`: the callback records
a run of its own holding fit (with validation), evaluate and predict, each batch one exact step."""

from __future__ import annotations

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.store.reader import open_run

from ._checks import check_steps, loop_markers
from .conftest import backend_param, with_callback


@pytest.mark.parametrize("backend", [backend_param("torch"), backend_param("jax")])
def test_callback_records_its_own_run_of_every_loop(tmp_path, backend):
    out, ran, _ = with_callback(tmp_path, backend, "arrays")
    run = open_run(str(out))
    rows = run.framework().to_pylist()
    check_steps(rows, ran, backend)
    assert {m["by"] for m in loop_markers(rows)} == {"keras"}
    assert RunAnalysis(str(out)).summary.fate.state == "succeeded"  # finished at the job's exit
