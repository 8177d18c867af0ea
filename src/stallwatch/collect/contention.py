"""What takes CPUs from the job, read at each snapshot: the host's steal, its load against its cores, and the
CPU limit of the job's cgroup (v2 `cpu.max`/`cpu.stat`, v1 `cpu.cfs_quota_us`/`cpu.stat`) with how often it
throttled; and, every few seconds, which other processes use the CPU (`competitors()`, kept in the node record)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

from stallwatch import records as r
from stallwatch.collect import procfs
from stallwatch.records import MetricKey

CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_REFRESH_S = 5.0  # the job's cgroup is looked up again this often (a job may be moved into one)
COMPETITORS_EVERY_S = 10.0  # every process's CPU is read this often (a walk of /proc)
TOP_COMPETITORS = 5
MAX_TRACKED = 4096  # processes whose CPU is remembered between walks
_NAN = math.nan


@dataclass(frozen=True)
class Competitor:
    """A process outside the job that used the node's CPU while it ran."""

    pid: int
    name: str
    cpu_s: float

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "name": self.name, "cpu_s": round(self.cpu_s, 3)}


@dataclass(frozen=True)
class CgroupFiles:
    """The job's cgroup CPU files: `stat` (cpu.stat), and the limit (v2: `max`; v1: `quota` and `period`)."""

    version: int
    stat: str
    max: str | None = None
    quota: str | None = None
    period: str | None = None


def cgroup_files(pid: int | str = "self", root: str = CGROUP_ROOT, proc: str = "/proc") -> CgroupFiles | None:
    """Where a process's cgroup keeps its CPU statistics and limit; None where none can be read."""
    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as fh:
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    unified = os.path.exists(os.path.join(root, "cgroup.controllers"))
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        rel = path.lstrip("/")
        if unified and controllers == "":
            base = os.path.join(root, rel)
            if os.path.exists(os.path.join(base, "cpu.stat")):
                return CgroupFiles(2, os.path.join(base, "cpu.stat"), max=os.path.join(base, "cpu.max"))
        if "cpu" in controllers.split(","):
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                base = os.path.join(root, mount, rel)
                if os.path.exists(os.path.join(base, "cpu.stat")):
                    return CgroupFiles(1, os.path.join(base, "cpu.stat"), quota=os.path.join(base, "cpu.cfs_quota_us"),
                                       period=os.path.join(base, "cpu.cfs_period_us"))
    return None


def read_throttling(files: CgroupFiles) -> tuple[int, float, float]:
    """(periods throttled, seconds throttled, limit in cores — NaN when unlimited) so far."""
    stat = {}
    for line in _read_text(files.stat).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            stat[key] = int(value)
    periods = stat.get("nr_throttled", 0)
    seconds = stat["throttled_usec"] / 1e6 if "throttled_usec" in stat else stat.get("throttled_time", 0) / 1e9
    cores = _NAN
    if files.version == 2 and files.max:
        parts = _read_text(files.max).split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]) > 0:
            cores = int(parts[0]) / int(parts[1])
    elif files.quota and files.period:
        quota, period = _read_text(files.quota).strip(), _read_text(files.period).strip()
        if quota.lstrip("-").isdigit() and period.isdigit() and int(quota) > 0 and int(period) > 0:
            cores = int(quota) / int(period)
    return periods, seconds, cores


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(65536).decode(errors="replace")
    except OSError:
        return ""


def steal_ticks(source: procfs.ProcFile | None = None) -> tuple[int, int]:
    """(all CPU ticks, steal ticks) of the node so far, from /proc/stat's first line."""
    text = source.read() if source is not None else procfs._read(procfs.STAT)
    f = text.split(b"\n", 1)[0].split()
    t = [int(x) for x in f[1:9]] + [0] * max(0, 9 - len(f))
    return sum(t[:8]), t[7]


class ContentionReader:
    """Host steal and load, the job's cgroup throttling; `job_pids()` names the job's processes (left out of the
    competitors)."""

    def __init__(self, job_pids: Callable[[], set[int]], root: str = CGROUP_ROOT) -> None:
        self._job_pids = job_pids
        self._root = root
        self._stat = procfs.ProcFile(procfs.STAT, one_record=True) if procfs.AVAILABLE else None
        self._loadavg = procfs.ProcFile("/proc/loadavg", one_record=True) if procfs.AVAILABLE else None
        self._job_pid: int | str = "self"
        self._cgroup: CgroupFiles | None = None
        self._cgroup_at = -math.inf
        self._prev_steal = self._steal()
        self._prev_throttle: tuple[int, float] | None = None
        self._cpu: dict[int, tuple[str, float, float]] = {}  # pid -> (name, CPU s at first walk, at the last)
        self._next_walk = 0.0
        self._own = {os.getpid(), os.getppid()}  # the sampler and `stallwatch run`
        self._job_seen: set[int] = set()  # every pid of the job seen (its workers may be gone by the end)

    @staticmethod
    def keys() -> list[MetricKey]:
        return [MetricKey(r.CPU, r.CPU_STEAL), MetricKey(r.CPU, r.LOAD_1), MetricKey(r.CGROUP, r.CPU_THROTTLED),
                MetricKey(r.CGROUP, r.CPU_THROTTLED_S), MetricKey(r.CGROUP, r.CPU_QUOTA_CORES)]

    def set_job_pid(self, pid: int) -> None:
        self._job_pid = pid
        self._cgroup_at = -math.inf
        self._prev_throttle = None

    def _steal(self) -> tuple[int, int] | None:
        try:
            return steal_ticks(self._stat) if self._stat is not None else None
        except (OSError, ValueError, IndexError):
            return None

    def read(self) -> list[float]:
        now = time.monotonic()
        steal = _NAN
        cur = self._steal()
        if cur is not None and self._prev_steal is not None and cur[0] > self._prev_steal[0]:
            steal = min(100.0, max(0.0, 100.0 * (cur[1] - self._prev_steal[1]) / (cur[0] - self._prev_steal[0])))
        self._prev_steal = cur
        load = _NAN
        try:
            if self._loadavg is not None:
                load = float(self._loadavg.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
        throttled = throttled_s = quota = _NAN
        if now - self._cgroup_at >= CGROUP_REFRESH_S:
            self._cgroup_at = now
            found = cgroup_files(self._job_pid, self._root)
            if found != self._cgroup:
                self._cgroup, self._prev_throttle = found, None
        if self._cgroup is not None:
            periods, seconds, quota = read_throttling(self._cgroup)
            if self._prev_throttle is not None:
                throttled = float(max(periods - self._prev_throttle[0], 0))
                throttled_s = max(seconds - self._prev_throttle[1], 0.0)
            self._prev_throttle = (periods, seconds)
        self._job_seen |= self._job_pids()
        if now >= self._next_walk:
            self._next_walk = now + COMPETITORS_EVERY_S
            self._walk()
        return [steal, load, throttled, throttled_s, quota]

    def _walk(self) -> None:
        """Every process's CPU so far (one read of its stat each): what each used since it was first seen."""
        if not procfs.AVAILABLE:
            return
        try:
            pids = procfs.pids()
        except OSError:
            return
        self._job_seen |= self._job_pids()
        seen: dict[int, tuple[str, float, float]] = {}
        for pid in sorted(pids)[:MAX_TRACKED]:
            try:
                data = procfs._read(f"/proc/{pid}/stat")
                name = data[data.index(b"(") + 1:data.rindex(b")")].decode(errors="replace")
                f = data[data.rindex(b")") + 2:].split()
                cpu = (int(f[11]) + int(f[12])) / procfs.CLOCK_TICKS
            except (OSError, ValueError, IndexError):
                continue
            before = self._cpu.get(pid)
            seen[pid] = (name, before[1] if before is not None and before[0] == name else cpu, cpu)
        self._cpu = seen

    def competitors(self) -> list[Competitor]:
        """The processes outside the job (and this sampler) that used the most CPU between the first walk and now,
        most first."""
        self._walk()
        job = self._job_pids() | self._job_seen | self._own
        used = [Competitor(pid, name, last - first) for pid, (name, first, last) in self._cpu.items()
                if pid not in job and last - first > 0]
        return sorted(used, key=lambda c: (-c.cpu_s, c.pid))[:TOP_COMPETITORS]

    def close(self) -> None:
        for f in (self._stat, self._loadavg):
            if f is not None:
                f.close()
