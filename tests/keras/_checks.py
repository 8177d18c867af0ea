"""Assertions shared by the Keras tests: exact steps per Keras loop, and each step's phases inside it."""

from __future__ import annotations

import json

from stallwatch.records import BACKWARD, DATA_WAIT, EVAL, FORWARD, OPTIMIZER, STEP, TRAIN

# The phases each backend's steps hold (stallwatch.keras.loop; docs/accuracy.md says why)
PHASES = {"torch": {DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER}, "jax": {DATA_WAIT}, "tensorflow": set()}


def check_steps(rows: list[dict], ran: dict, backend: str) -> None:
    """Exactly the batches the job ran: TRAIN train_step 0..n-1; EVAL test_step (validation inside fit, then
    evaluate) then predict_step, numbered on from one another; every step's phases within it."""
    steps = [r for r in rows if r["kind"] == STEP]
    train = [r for r in steps if r["mode"] == TRAIN]
    evals = sorted((r for r in steps if r["mode"] == EVAL), key=lambda r: r["step"])
    assert [r["step"] for r in train] == list(range(ran["train"]))
    assert {r["name"] for r in train} == {"train_step"}
    assert [r["step"] for r in evals] == list(range(ran["test"] + ran["predict"]))
    assert [r["name"] for r in evals] == ["test_step"] * ran["test"] + ["predict_step"] * ran["predict"]
    assert not [r for r in steps if r["mode"] not in (TRAIN, EVAL)]
    by_step = {(r["mode"], r["step"]): r for r in steps}
    phases: dict[str, set[int]] = {}
    for r in rows:
        if r["kind"] in (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER) and r["step"] is not None:
            s = by_step[(r["mode"], r["step"])]
            assert s["start_us"] <= r["start_us"] <= r["end_us"] <= s["end_us"], r
            if r["mode"] == TRAIN:
                phases.setdefault(r["kind"], set()).add(r["step"])
    expected = PHASES[backend]
    assert set(phases) == expected
    for kind in expected:
        assert phases[kind] == set(range(ran["train"])), kind  # in every training step
    if backend == "torch":  # evaluation steps run forward only
        assert not [r for r in rows if r["mode"] == EVAL and r["kind"] in (BACKWARD, OPTIMIZER)]


def loop_markers(rows: list[dict]) -> list[dict]:
    return [json.loads(r["args"]) for r in rows if r["kind"] == "loop"]


def inputs(rows: list[dict]) -> list[dict]:
    return [json.loads(r["args"]) for r in rows if r["kind"] == "dataloader"]
