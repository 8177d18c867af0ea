"""Shared fixtures: running the real `stallwatch` command line in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

STALLWATCH = [sys.executable, "-m", "stallwatch.cli"]


@pytest.fixture
def run_stallwatch(tmp_path: Path):
    """Run `stallwatch ARGS…` as a user would; returns the CompletedProcess (stdout/stderr as text)."""

    def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
            cwd: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
        full_env = dict(os.environ)
        full_env.update(env or {})
        return subprocess.run([*STALLWATCH, *args], capture_output=True, text=True, timeout=timeout,
                              env=full_env, cwd=cwd or tmp_path, **kwargs)

    return run


@pytest.fixture(autouse=True)
def _stallwatch_logger_as_it_was():
    """A test that runs the command line in-process (`cli.main`) configures the `stallwatch` logger with a handler
    on the stderr pytest captured for it: later tests would log into that closed stream instead of to caplog.
    Each test leaves the logger as it found it, so the suite passes in any order."""
    from stallwatch.log import logger

    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]
