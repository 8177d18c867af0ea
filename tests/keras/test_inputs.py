"""Keras input as the input rules see it: a PyDataset whose __getitem__ sleeps 20 ms in the training thread
(the planted bottleneck; workers=1, Keras's default) makes the job input-bound on each backend where the wait
is measured, with advice in Keras's terms (PyDataset workers, use_multiprocessing), not DataLoader's."""

from __future__ import annotations

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.store.reader import open_run

from ._checks import check_steps, inputs, loop_markers
from .conftest import SLEEP_S, backend_param, under_run


@pytest.fixture(scope="module", params=[backend_param("torch"), backend_param("jax")])
def slow(request, tmp_path_factory):
    backend = request.param
    out, ran, _ = under_run(tmp_path_factory.mktemp(f"keras-slow-{backend}"), backend, "slow")
    return backend, out, ran


def test_slow_py_dataset_is_input_bound_with_keras_advice(slow):
    backend, out, ran = slow
    rows = open_run(str(out)).framework().to_pylist()
    check_steps(rows, ran, backend)
    train_input = next(d for d in inputs(rows) if d["loop"] == "train")
    assert train_input["input"] == "py_dataset" and train_input["dataset"] == "SlowData"
    assert (train_input["num_workers"], train_input["worker_threads"], train_input["prefetch"]) == (0, 0, False)
    analysis = RunAnalysis(str(out))
    bound = analysis.rule("InputBound")
    assert bound.fired
    rank = next(e for e in bound.details["ranks"].values() if e["triggered"])
    assert rank["cause"] == "main_process" and rank["input"] == "py_dataset"
    assert rank["wait_s"] >= ran["train"] * SLEEP_S  # every planted sleep is measured as waiting
    assert "use_multiprocessing=True" in bound.recommendation and "DataLoader" not in bound.recommendation
    loader = analysis.rule("Dataloader")
    assert loader.fired and loader.details["keras"]
    assert "PyDataset" in loader.recommendation and "pin_memory" not in loader.recommendation
    # on a busy machine CPUContention may rank above it: the only finding a verdict may gain beside other work
    assert [f.rule for f in analysis.findings.findings if f.rule != "CPUContention"][0] == "InputBound"


@pytest.mark.parametrize("backend", [backend_param("torch")])
def test_py_dataset_worker_processes_are_described_and_send_nothing_twice(tmp_path, backend):
    """Keras's worker pool is forked and terminated with SIGTERM: before, each worker flushed its copy of the
    events its parent had queued at the fork (5 `loop` markers and 3 `dataloader` events for one fit)."""
    out, ran, _ = under_run(tmp_path, backend, "workers")
    rows = open_run(str(out)).framework().to_pylist()
    check_steps(rows, ran, backend)
    assert len(loop_markers(rows)) == 3  # fit, evaluate, predict: one take-over each
    described = inputs(rows)
    assert [d["loop"] for d in described] == ["train", "test", "test", "predict"]  # fit's validation, evaluate
    train = described[0]
    assert train["input"] == "py_dataset" and train["use_multiprocessing"] and train["prefetch"]
    assert (train["num_workers"], train["worker_threads"]) == (2, 0)
    assert {r["pid"] for r in rows} == {rows[0]["pid"]}  # every event from the training process itself
