"""A fresh child cgroup with a CPU limit, for tests that need a process to wait for its quota however busy the
machine is; the test is skipped where none can be made (not root, no cpu controller)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CPU_V1 = Path("/sys/fs/cgroup/cpu")
CPU_V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


@contextmanager
def cpu_limited_group(quota_us: int) -> Iterator[Path]:
    """The file that takes a pid to move it into a new cgroup limited to `quota_us` of CPU per 100 ms; the group
    is removed afterwards (once its processes have left it)."""
    group = _make(quota_us)
    try:
        yield group / "cgroup.procs"
    finally:
        for _ in range(50):  # a job's process leaves the group as it exits
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _make(quota_us: int) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root and a cgroup CPU controller (v2 cpu.max or v1 cpu.cfs_quota_us)")
    name = f"stallwatch-test-{uuid.uuid4().hex[:8]}"
    try:
        if (CPU_V2 / "cgroup.controllers").exists() and "cpu" in (CPU_V2 / "cgroup.controllers").read_text().split():
            group = CPU_V2 / name
            group.mkdir()
            (group / "cpu.max").write_text(f"{quota_us} {PERIOD_US}")
            return group
        if (CPU_V1 / "cpu.cfs_quota_us").exists():
            group = CPU_V1 / name
            group.mkdir()
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
            return group
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup with a CPU limit here: {exc}")
    pytest.skip("needs root and a cgroup CPU controller (v2 cpu.max or v1 cpu.cfs_quota_us)")
