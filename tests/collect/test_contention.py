"""The sampler's contention readings: the job's cgroup CPU limit and throttling (v1 and v2 layouts, written here
as files), steal from /proc/stat, and the processes outside the job that used the CPU (real busy loops)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stallwatch.collect import procfs
from stallwatch.collect.contention import ContentionReader, cgroup_files, read_throttling, steal_ticks


def _proc(tmp: Path, text: str) -> Path:
    (tmp / "proc" / "7").mkdir(parents=True)
    (tmp / "proc" / "7" / "cgroup").write_text(text)
    return tmp / "proc"


def test_cgroup_v2_limit_and_throttling(tmp_path: Path):
    root = tmp_path / "cg"
    (root / "kubepods" / "pod1").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "kubepods" / "pod1" / "cpu.stat").write_text(
        "usage_usec 100\nnr_periods 50\nnr_throttled 12\nthrottled_usec 3500000\n")
    (root / "kubepods" / "pod1" / "cpu.max").write_text("50000 100000\n")
    files = cgroup_files(7, str(root), str(_proc(tmp_path, "0::/kubepods/pod1\n")))
    assert files is not None and files.version == 2
    assert read_throttling(files) == (12, 3.5, 0.5)
    (root / "kubepods" / "pod1" / "cpu.max").write_text("max 100000\n")
    assert math.isnan(read_throttling(files)[2])


def test_cgroup_v1_limit_and_throttling(tmp_path: Path):
    root = tmp_path / "cg"
    group = root / "cpu,cpuacct" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "cpu.stat").write_text("nr_periods 9\nnr_throttled 4\nthrottled_time 2000000000\n")
    (group / "cpu.cfs_quota_us").write_text("150000\n")
    (group / "cpu.cfs_period_us").write_text("100000\n")
    files = cgroup_files(7, str(root), str(_proc(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")))
    assert files is not None and files.version == 1
    assert read_throttling(files) == (4, 2.0, 1.5)
    (group / "cpu.cfs_quota_us").write_text("-1\n")
    assert math.isnan(read_throttling(files)[2])


def test_no_cgroup_reads_as_none(tmp_path: Path):
    assert cgroup_files(7, str(tmp_path / "none"), str(_proc(tmp_path, "0::/\n"))) is None


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


@pytest.mark.skipif(not procfs.AVAILABLE, reason="Linux /proc")
def test_steal_and_the_processes_outside_the_job(tmp_path: Path):
    total, steal = steal_ticks()
    assert total > 0 and 0 <= steal <= total
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    job = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        reader = ContentionReader(lambda: {job.pid})
        reader.set_job_pid(job.pid)
        values = reader.read()
        assert len(values) == len(reader.keys()) and 0 <= values[1]  # load
        before = _cpu_s(busy.pid)
        deadline = time.monotonic() + 60  # on a loaded machine the busy loop gets a fraction of a core
        while _cpu_s(busy.pid) - before < 0.3 and time.monotonic() < deadline:
            time.sleep(0.2)
        names = {c.pid: c for c in reader.competitors()}
        assert busy.pid in names and job.pid not in names and os.getpid() not in names, names
        assert names[busy.pid].cpu_s >= 0.2  # what it used since the first walk, in whole ticks
        reader.close()
    finally:
        for p in (busy, job):
            p.kill()
            p.wait()
