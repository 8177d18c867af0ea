"""A real `stallwatch dashboard` process on a free loopback port, over generated runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from ..report._full_runs import Planted, full_run


@dataclass
class Served:
    proc: subprocess.Popen
    url: str
    stderr: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def serve(target: Path, tmp: Path, *args: str) -> Served:
    """`stallwatch dashboard TARGET --port 0 ARGS`, once it prints its URL."""
    err = tmp / f"dashboard-{time.monotonic_ns()}.err"
    with open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "stallwatch", "dashboard", str(target), "--port", "0", *args],
                                stdout=subprocess.DEVNULL, stderr=e, env=dict(os.environ))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"at (http://\S+)", err.read_text())
        if m:
            return Served(proc, m.group(1), err)
        if proc.poll() is not None:
            raise AssertionError(f"the dashboard exited: {err.read_text()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the dashboard printed no URL")


@pytest.fixture(scope="package")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Planted]:
    root = tmp_path_factory.mktemp("dash-runs")
    planted = full_run(root / "two-nodes", nodes=("algo-1", "algo-2"), gpus=2, ranks=2)
    full_run(root / "cpu-only", nodes=("vm",), gpus=0)
    return root, planted


@pytest.fixture(scope="package")
def served(runs_dir, tmp_path_factory) -> Iterator[Served]:
    s = serve(runs_dir[0], tmp_path_factory.mktemp("dash-log"))
    yield s
    s.stop()
