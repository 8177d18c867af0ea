"""`stallwatch config RUN`: live changes are validated, written atomically, or refused leaving the file as is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest


@pytest.fixture
def finished_run(run_stallwatch, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    p = run_stallwatch("run", "--interval", "100ms", "--out", str(run), "--", sys.executable, "-c", "pass")
    assert p.returncode == 0, p.stderr
    return run


def test_show_prints_the_runs_config(run_stallwatch, finished_run: Path) -> None:
    p = run_stallwatch("config", str(finished_run))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["sample_interval_ms"] == 100


def test_a_valid_change_is_written_and_reported(run_stallwatch, finished_run: Path) -> None:
    p = run_stallwatch("config", str(finished_run), "--detailed-profiling", "300:2", "--python-profiler", "pyinstrument")
    assert p.returncode == 0, p.stderr
    assert "detailed_profiling: null -> 300:2" in p.stdout
    stored = json.loads((finished_run / "config.json").read_text())
    assert stored["detailed_profiling"] == {"start_step": 300, "num_steps": 2}
    assert stored["python_profiler"] == "pyinstrument" and stored["sample_interval_ms"] == 100
    p = run_stallwatch("config", str(finished_run), "--clear", "detailed_profiling")
    assert p.returncode == 0 and json.loads((finished_run / "config.json").read_text())["detailed_profiling"] is None


def test_an_invalid_change_is_refused_and_nothing_changes(run_stallwatch, finished_run: Path) -> None:
    before = (finished_run / "config.json").read_bytes()
    p = run_stallwatch("config", str(finished_run), "--detailed-profiling", "3:0")
    assert p.returncode == 2 and "detailed_profiling.num_steps=0" in p.stderr
    p = run_stallwatch("config", str(finished_run), "--python-profiling", "5:1", "--detailed-profiling",
                       "2026-11-22T06:00:00Z/0")
    assert p.returncode == 2 and "duration_s" in p.stderr
    assert (finished_run / "config.json").read_bytes() == before


def test_fields_fixed_at_start_are_not_offered(run_stallwatch, finished_run: Path) -> None:
    p = run_stallwatch("config", str(finished_run), "--max-storage-mb", "100")  # the sampler sized its cap at start
    assert p.returncode == 2 and "unrecognized arguments: --max-storage-mb" in p.stderr


def test_a_directory_that_is_not_a_run(run_stallwatch, tmp_path: Path) -> None:
    p = run_stallwatch("config", str(tmp_path), "--detailed-profiling", "5:1")
    assert p.returncode == 2 and "not a stallwatch run" in p.stderr
