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
