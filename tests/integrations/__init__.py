"""Tests of the framework callbacks: real tiny trainings run as jobs, their recorded steps checked here."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from stallwatch.records import BACKWARD, DATA_WAIT, EVAL, FORWARD, OPTIMIZER, STEP, TRAIN
from stallwatch.store.reader import open_run

# Nothing may be downloaded, and the jobs stay on one thread each (2 cores for the job and its sampler).
JOB_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}


def job_env() -> dict[str, str]:
    """For a job run without `stallwatch run`: no STALLWATCH_* variable of ours leaks into it."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("STALLWATCH_")}, **JOB_ENV}


def steps_by_mode(out: Path) -> tuple[dict[str, list[dict]], dict[tuple[str, int], list[dict]]]:
    """The run's step events per mode (in time order), and every other event per (mode, step)."""
    steps: dict[str, list[dict]] = defaultdict(list)
    inside: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for row in sorted(open_run(str(out)).framework().to_pylist(), key=lambda r: r["start_us"]):
        if row["kind"] == STEP:
            steps[row["mode"]].append(row)
        elif row["step"] is not None:
            inside[(row["mode"], row["step"])].append(row)
    return steps, inside


def assert_steps(out: Path, train: int, evals: int, *, forwards_per_train_step: int = 1) -> dict:
    """Exactly `train` TRAIN and `evals` EVAL steps, numbered 0..n-1 in time order, nothing else; each TRAIN
    step holds its forwards, backwards, one optimizer phase and a data wait, all within its bounds."""
    steps, inside = steps_by_mode(out)
    assert {m: len(s) for m, s in steps.items()} == ({TRAIN: train, EVAL: evals} if evals else {TRAIN: train})
    for mode, rows in steps.items():
        assert [r["step"] for r in rows] == list(range(len(rows))), mode
    ordered = sorted((r for rows in steps.values() for r in rows), key=lambda r: r["start_us"])
    for a, b in zip(ordered, ordered[1:]):
        assert a["end_us"] <= b["start_us"], ("steps overlap", a, b)
    for step in steps[TRAIN]:
        events = inside[(TRAIN, step["step"])]
        kinds = [e["kind"] for e in events]
        assert kinds.count(FORWARD) == forwards_per_train_step, (step["step"], kinds)
        assert kinds.count(BACKWARD) == forwards_per_train_step, (step["step"], kinds)
        assert kinds.count(OPTIMIZER) >= 1 and kinds.count(DATA_WAIT) >= 1, (step["step"], kinds)
        for e in events:
            assert step["start_us"] <= e["start_us"] <= e["end_us"] <= step["end_us"], (step, e)
        # nothing counted twice: a closure's forward/backward are not also optimizer time
        busy = sum(e["end_us"] - e["start_us"] for e in events if e["kind"] in (FORWARD, BACKWARD, OPTIMIZER))
        assert busy <= step["end_us"] - step["start_us"] + 2, (step, events)
    for step in steps.get(EVAL, []):
        events = inside[(EVAL, step["step"])]
        assert [e["kind"] for e in events].count(FORWARD) >= 1 and BACKWARD not in [e["kind"] for e in events]
        for e in events:
            assert step["start_us"] <= e["start_us"] <= e["end_us"] <= step["end_us"], (step, e)
    return {"steps": steps, "inside": inside}
