"""Keras 3 jobs run as a user would (a script in a subprocess: the backend is fixed when keras is imported,
so each backend gets its own process, KERAS_BACKEND set per run)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..collect._support import stallwatch as run_cli

JOB = Path(__file__).with_name("keras_job.py")
BACKENDS = ("torch", "jax", "tensorflow")
SLEEP_S = 0.020  # the slow PyDataset's planted sleep per batch


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def backend_param(backend: str):
    """A backend as a test parameter, skipped where its package is not installed (TensorFlow is not in the dev
    extra: see the README's Keras section for the command that runs its tests)."""
    missing = [p for p in ("keras", backend) if not installed(p)]
    return pytest.param(backend, id=backend, marks=pytest.mark.skipif(
        bool(missing), reason=f"{' and '.join(missing)} not installed"))


ALL_BACKENDS = [backend_param(b) for b in BACKENDS]


def job_env(backend: str) -> dict[str, str]:
    return {"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
            "KERAS_JOB_SLEEP_S": str(SLEEP_S)}


def under_run(tmp: Path, backend: str, scenario: str, *flags: str) -> tuple[Path, dict, subprocess.CompletedProcess]:
    """`stallwatch run [flags] -- python keras_job.py` (zero code): the run directory, what the job ran."""
    out, ran = tmp / "run", tmp / "ran.json"
    p = run_cli(tmp, "run", "--report", "off",
                "--out", str(out), "--rules-interval", "0", "--flush-interval", "1", *flags,
                "--", sys.executable, str(JOB), str(ran), scenario, env=job_env(backend), timeout=240)
    assert p.returncode == 0, p.stderr[-4000:]
    return out, json.loads(ran.read_text()), p


def with_callback(tmp: Path, backend: str, scenario: str) -> tuple[Path, dict, subprocess.CompletedProcess]:
    """The job passing stallwatch.keras.ProfilerCallback(out=…) itself, not under `stallwatch run`."""
    out, ran = tmp / "run", tmp / "ran.json"
    env = dict(os.environ, **job_env(backend))
    for name in ("STALLWATCH_EVENTS", "STALLWATCH_RUN", "STALLWATCH_CONFIG", "STALLWATCH_STAGING"):
        env.pop(name, None)
    p = subprocess.run([sys.executable, str(JOB), str(ran), scenario, "callback", str(out)], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-4000:]
    return out, json.loads(ran.read_text()), p
