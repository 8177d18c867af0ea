"""Kills by the kernel's out-of-memory killer in the job's memory cgroup, counted by the launcher while the job
runs: cgroup v2 `memory.events` (oom_kill), v1 `memory.oom_control` (oom_kill). A job that dies of SIGKILL while
the count grew was killed by the OOM killer, and the run says so (node record `oom_kills`, `memory_limit_bytes`)."""

from __future__ import annotations

import os
import time

from stallwatch.torch.memory import UNLIMITED

ROOT = "/sys/fs/cgroup"
LOOK_EVERY_S = 1.0  # the job's cgroup is looked up again this often (a job may move itself into one)


def memory_cgroup_dir(pid: int | str, root: str = ROOT, proc: str = "/proc") -> tuple[str, int] | None:
    """The directory of the process's memory cgroup and its version (2 or 1); None where none can be read."""
    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as fh:
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    unified = os.path.exists(os.path.join(root, "cgroup.controllers"))
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if unified and parts[0] == "0" and parts[1] == "":
            return os.path.join(root, parts[2].strip("/")), 2
        if not unified and "memory" in parts[1].split(","):
            return os.path.join(root, "memory", parts[2].strip("/")), 1
    return None


def read_oom_kills(directory: str, version: int) -> int | None:
    name = "memory.events" if version == 2 else "memory.oom_control"
    try:
        with open(os.path.join(directory, name), "rb") as fh:
            for line in fh.read(4096).decode("ascii", "replace").splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def read_limit(directory: str, version: int) -> int | None:
    try:
        with open(os.path.join(directory, "memory.max" if version == 2 else "memory.limit_in_bytes"), "rb") as fh:
            text = fh.read(64).strip()
        value = int(text)
    except (OSError, ValueError):
        return None
    return value if 0 < value < UNLIMITED else None


class OomWatch:
    """`look(pid)` while the job runs (cheap: at most every LOOK_EVERY_S), `kills()` at its end: the kills counted
    in the cgroups the job was seen in since it was first seen there, and the tightest limit among them."""

    def __init__(self, root: str = ROOT, proc: str = "/proc") -> None:
        self._root, self._proc = root, proc
        self._base: dict[str, tuple[int, int]] = {}  # directory -> (version, oom_kill when first seen)
        self._at = -1e18
        self.limit: int | None = None

    def look(self, pid: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._at < LOOK_EVERY_S:
            return
        self._at = now
        try:
            found = memory_cgroup_dir(pid, self._root, self._proc)
            if found is None or found[0] in self._base:
                return
            directory, version = found
            count = read_oom_kills(directory, version)
            if count is None:
                return
            self._base[directory] = (version, count)
            limit = read_limit(directory, version)
            if limit is not None:
                self.limit = limit if self.limit is None else min(self.limit, limit)
        except Exception:  # a cgroup that cannot be read: nothing to count
            return

    def peak(self) -> int | None:
        """The highest memory use of the cgroup where the OOM killer killed (else of those the job was seen in), in
        bytes: what the killer judged."""
        found = []
        killed = {d for d, (v, base) in self._base.items() if (read_oom_kills(d, v) or 0) > base}
        for directory, (version, _) in self._base.items():
            if killed and directory not in killed:  # the cgroup whose limit was hit, not its parents'
                continue
            name = "memory.peak" if version == 2 else "memory.max_usage_in_bytes"
            try:
                with open(os.path.join(directory, name), "rb") as fh:
                    found.append(int(fh.read(64).strip()))
            except (OSError, ValueError):
                continue
        return max(found) if found else None

    def kills(self) -> int | None:
        """OOM kills since the job was first seen in each of its cgroups; None when no counter could be read."""
        if not self._base:
            return None
        total = 0
        for directory, (version, base) in self._base.items():
            now = read_oom_kills(directory, version)
            if now is not None:
                total += max(now - base, 0)
        return total
