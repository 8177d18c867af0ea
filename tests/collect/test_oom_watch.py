"""The launcher's count of kills by the kernel's OOM killer in the job's memory cgroup, on cgroup files laid out as
v1 and v2 have them: a job that moves into another cgroup is followed, kills counted from when it was first seen."""

from __future__ import annotations

from pathlib import Path

from stallwatch.collect.oom_watch import OomWatch


def _proc(tmp: Path, pid: int, text: str) -> None:
    (tmp / f"proc/{pid}").mkdir(parents=True, exist_ok=True)
    (tmp / f"proc/{pid}/cgroup").write_text(text)


def test_v1_kills_limit_and_peak_of_the_group_that_killed(tmp_path: Path):
    root = tmp_path / "cg"
    for name, kills, limit, peak in (("", 3, 9223372036854771712, 9 << 30), ("job", 0, 300 << 20, 299 << 20)):
        d = root / "memory" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
        (d / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (d / "memory.max_usage_in_bytes").write_text(f"{peak}\n")
    _proc(tmp_path, 5, "4:memory:/\n")
    watch = OomWatch(str(root), str(tmp_path / "proc"))
    watch.look(5, force=True)
    _proc(tmp_path, 5, "4:memory:/job\n")  # the job moved itself into a limited group
    watch.look(5, force=True)
    assert watch.kills() == 0 and watch.limit == 300 << 20
    (root / "memory/job/memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert watch.kills() == 1 and watch.peak() == 299 << 20  # the killing group's, not the root's 9 GB


def test_v2_memory_events_and_nothing_to_read(tmp_path: Path):
    root = tmp_path / "v2"
    (root / "k").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("memory\n")
    (root / "k/memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\n")
    (root / "k/memory.max").write_text("max\n")
    _proc(tmp_path, 6, "0::/k\n")
    watch = OomWatch(str(root), str(tmp_path / "proc"))
    watch.look(6, force=True)
    (root / "k/memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 3\n")
    assert watch.kills() == 1 and watch.limit is None
    nothing = OomWatch(str(root), str(tmp_path / "proc"))
    nothing.look(7, force=True)  # no such process
    assert nothing.kills() is None and nothing.peak() is None
