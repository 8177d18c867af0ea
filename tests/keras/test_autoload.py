"""A plain Keras script (NumPy arrays in memory) under `stallwatch run`, on each backend: the exact steps of
fit (with validation), evaluate and predict with their phases, the input described as Keras's, no input
verdict, and a detailed profiling window from the backend's own profiler."""

from __future__ import annotations

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.store.reader import open_run

from ._checks import PHASES, check_steps, inputs, loop_markers
from .conftest import ALL_BACKENDS, under_run


@pytest.fixture(scope="module", params=ALL_BACKENDS)
def in_memory(request, tmp_path_factory):
    backend = request.param
    out, ran, p = under_run(tmp_path_factory.mktemp(f"keras-{backend}"), backend, "arrays",
                            "--detailed-profiling", "5:2")
    return backend, out, ran, p


def test_exact_steps_per_loop_and_their_phases(in_memory):
    """Before: a torch-backend fit with validation counted 2 EVAL steps too many (Keras builds the model on
    a batch of each new input) and had no optimizer phase."""
    backend, out, ran, _ = in_memory
    assert ran["backend"] == backend
    rows = open_run(str(out)).framework().to_pylist()
    check_steps(rows, ran, backend)
    markers = loop_markers(rows)
    assert markers and all(m["by"] == "keras" and m["backend"] == backend for m in markers)
    assert set(markers[0]["phases"]) == PHASES[backend]


def test_input_is_described_as_keras_arrays_and_judged_no_bottleneck(in_memory):
    backend, out, _, _ = in_memory
    rows = open_run(str(out)).framework().to_pylist()
    described = inputs(rows)
    assert {d["loop"] for d in described} == {"train", "test", "predict"}
    assert all(d["framework"] == "keras" and d["input"] == "arrays" and d["in_memory"] for d in described)
    analysis = RunAnalysis(str(out))
    loader = analysis.rule("Dataloader")
    if backend == "tensorflow":  # the input is read inside the compiled step: the wait is not measured
        for name in ("Dataloader", "InputBound"):
            result = analysis.rule(name)
            assert result.status == "not_applicable" and "TensorFlow" in result.message, result.message
        return
    assert loader.applies and not loader.fired
    assert loader.details["nodes"][next(iter(loader.details["nodes"]))]["reason"] == "in_memory"
    assert "in memory" in loader.recommendation
    assert analysis.rule("InputBound").applies and not analysis.rule("InputBound").fired
    assert not [f for f in analysis.findings.findings if f.rule in ("InputBound", "Dataloader")]


def test_detailed_window_uses_the_backends_profiler(in_memory):
    backend, out, _, p = in_memory
    run = open_run(str(out))
    windows = run.profiles("detailed")
    if backend == "tensorflow" and not windows:
        pytest.skip("tf.profiler's trace needs tensorboard-plugin-profile: " + p.stderr[-300:])
    assert len(windows) == 1
    w = windows[0]
    assert w["status"] == "complete" and (w["first_step"], w["last_step"]) == (5, 6)
    assert w["profiler"] == {"torch": "torch.profiler", "jax": "jax.profiler", "tensorflow": "tf.profiler"}[backend]
    ops = run.operators().to_pylist()
    assert ops and all(o["self_us"] >= 0 for o in ops)
