"""The training job's process tree: its CPU and memory, and how many data-loader workers are alive and busy."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from stallwatch import records as r
from stallwatch.collect import procfs
from stallwatch.records import MetricKey

PROC_METRICS = (r.PROC_CPU_UTIL, r.PROC_RSS_BYTES, r.PROC_COUNT, r.WORKERS_ALIVE, r.WORKERS_BUSY, r.WORKERS_CPU_UTIL,
                r.RUNQ_MS_PER_S, r.WORKERS_RUNQ_MS_PER_S, r.NVCSW_PER_S)
# A worker counts as busy when it used at least this share of one core during the interval.
BUSY_CORE_FRACTION = 0.10
# The tree is looked at on a back-off: every TREE_REFRESH_MIN_S right after it changed (a job starting its
# data-loader workers), doubling up to TREE_REFRESH_S while it stays the same. A look lists /proc and reads
# the parent of each process born since the last one; walking the whole tree means reading every process
# on the machine (2.2 ms with 65 processes when the sampler wakes cold, more on busy machines), done every
# TREE_FULL_S (it also finds a new member that got a pid seen before, and reads the tree off Linux).
TREE_REFRESH_S = 10.0
TREE_REFRESH_MIN_S = 0.5
TREE_FULL_S = 60.0
# Members whose /proc/<pid>/stat stays open (procfs.ProcFile); past these, read by path: a tree of thousands
# of processes must not take the sampler's file descriptors (a soft limit of 1,024 is common).
MAX_KEPT_OPEN = 256


@dataclass
class _Member:
    proc: psutil.Process
    is_worker: bool
    cpu_s: float | None = None
    stat: procfs.ProcFile | None = None  # its /proc/<pid>/stat, kept open while it is followed
    runq_ns: int | None = None  # its main thread's run-queue delay so far (/proc/<pid>/schedstat)
    nvcsw: int | None = None  # its main thread's involuntary context switches so far

    def close(self) -> int:
        """Its kept file closed; 1 if it had one."""
        if self.stat is None:
            return 0
        self.stat.close()
        self.stat = None
        return 1


def looks_like_worker(cmdline: list[str], parent_cmdline: list[str] | None) -> bool:
    """A data-loader worker is a multiprocessing child: forked (same command line as its parent, which also
    covers children of a fork server) or spawned. The fork server and the resource tracker themselves are
    helpers, not workers."""
    if parent_cmdline is not None and cmdline and cmdline == parent_cmdline:
        return True
    text = " ".join(cmdline)
    return "multiprocessing.spawn" in text or "--multiprocessing-fork" in text


class ProcessTreeReader:
    """Follows one root pid and its descendants; gives zeros until a root is set and after it is gone."""

    def __init__(self, cores: int, refresh_s: float = TREE_REFRESH_S) -> None:
        self._cores = max(1, cores)
        self._refresh_s = refresh_s
        self._min_refresh_s = min(TREE_REFRESH_MIN_S, refresh_s)
        self._delay = self._min_refresh_s
        self._root: psutil.Process | None = None
        self._members: dict[int, _Member] = {}
        self._cmdlines: dict[int, list[str]] = {}
        self._next_refresh = 0.0
        self._pids: set[int] | None = None  # every pid at the last look (Linux), to tell which were born since
        self._next_full = 0.0
        self._kept_open = 0  # members' files kept open (MAX_KEPT_OPEN)
        self._prev_mono = time.monotonic()
        self._known_workers: set[int] = set()  # reported by the job's data loaders: no guessing needed

    def add_workers(self, pids: list[int]) -> None:
        """Data-loader worker pids the job reported; they are looked for at the next snapshot."""
        new = set(pids) - self._known_workers
        if new:
            self._known_workers |= new
            self._next_refresh = 0.0

    def set_root(self, pid: int) -> None:
        try:
            self._root = psutil.Process(pid)
        except psutil.Error:
            self._root = None
        self.close()
        self._pids = None
        self._next_refresh = 0.0
        self._delay = self._min_refresh_s

    def pids(self) -> set[int]:
        """The job's processes followed now."""
        return set(self._members)

    def close(self) -> None:
        for m in self._members.values():
            self._kept_open -= m.close()
        self._members.clear()

    @staticmethod
    def keys() -> list[MetricKey]:
        return [MetricKey(r.PROC, m) for m in PROC_METRICS]

    def _refresh(self, now: float) -> None:
        before = set(self._members)
        self._scan()
        changed = set(self._members) != before
        self._delay = self._min_refresh_s if changed else min(self._delay * 2, self._refresh_s)
        self._next_refresh = now + self._delay

    def _scan(self) -> None:
        """One look for members born or gone: from the pids born since the last look, or a whole walk."""
        if self._root is None:
            return
        now = time.monotonic()
        if self._pids is not None and now < self._next_full:
            try:
                self._scan_born()
                return
            except OSError:  # /proc not listable now (out of file descriptors): the whole walk, as off Linux
                pass
        try:
            pids = procfs.pids() if procfs.AVAILABLE else None  # before the walk: one born during it is new next time
        except OSError:
            pids = None
        self._scan_all()
        self._pids, self._next_full = pids, now + TREE_FULL_S

    def _scan_born(self) -> None:
        """Members are found among the processes born since the last look, by their parents: a child of a
        member, or of a process born with it, is a member (members that exit are noticed at each read)."""
        assert self._pids is not None and self._root is not None
        pids = procfs.pids()
        born = pids - self._pids
        self._pids = pids
        parents = {pid: ppid for pid in born if (ppid := procfs.parent(pid)) is not None}
        grew = True
        while grew:
            grew = False
            for pid, ppid in parents.items():
                if pid not in self._members and ppid in self._members:
                    try:
                        member = self._member(psutil.Process(pid), self._root.pid)
                    except psutil.Error:
                        member = None
                    if member is not None:
                        self._members[pid] = member
                        grew = True
        for pid in self._known_workers & self._members.keys():
            self._members[pid].is_worker = True

    def _member(self, p: psutil.Process, root_pid: int) -> _Member | None:
        try:
            cmdline = p.cmdline()
            parent = p.ppid()
        except psutil.Error:
            return None
        self._cmdlines[p.pid] = cmdline
        worker = p.pid != root_pid and (p.pid in self._known_workers
                                        or looks_like_worker(cmdline, self._cmdlines.get(parent)))
        kept = procfs.AVAILABLE and self._kept_open < MAX_KEPT_OPEN
        self._kept_open += kept
        return _Member(p, worker, stat=procfs.ProcFile(f"/proc/{p.pid}/stat", one_record=True) if kept else None)

    def _scan_all(self) -> None:
        root = self._root
        assert root is not None
        try:
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            procs = [m.proc for m in self._members.values() if m.proc.is_running()]
        seen: dict[int, _Member] = {}
        for p in procs:
            known = self._members.get(p.pid)
            if known is not None and _alive(known.proc):
                known.is_worker = known.is_worker or p.pid in self._known_workers
                seen[p.pid] = known
                continue
            if (member := self._member(p, root.pid)) is not None:
                seen[p.pid] = member
        for pid, m in self._members.items():
            if seen.get(pid) is not m:
                self._kept_open -= m.close()
        self._members = seen
        self._cmdlines = {pid: self._cmdlines[pid] for pid in seen if pid in self._cmdlines}

    def read(self) -> list[float]:
        now = time.monotonic()
        dt = max(now - self._prev_mono, 1e-6)
        self._prev_mono = now
        if self._root is None:
            return [0.0] * len(PROC_METRICS)
        if now >= self._next_refresh:
            self._refresh(now)
        cpu_total = rss = 0.0
        count = alive = busy = 0
        workers_cpu = runq = workers_runq = switches = 0.0
        gone = []
        for pid, m in self._members.items():
            reading = _read_process(m)
            if reading is None:
                gone.append(pid)
                continue
            cpu_s, mem = reading
            used = 0.0 if m.cpu_s is None else max(0.0, cpu_s - m.cpu_s)
            m.cpu_s = cpu_s
            cpu_total += used
            rss += mem
            waited, switched = _contention(m)
            runq += waited
            switches += switched
            count += 1
            if m.is_worker:
                alive += 1
                workers_cpu += used
                workers_runq += waited
                if used >= BUSY_CORE_FRACTION * dt:
                    busy += 1
        for pid in gone:
            self._kept_open -= self._members.pop(pid).close()
            self._cmdlines.pop(pid, None)
        if gone:
            self._next_refresh = 0.0  # the tree changed: look again at the next snapshot, then often
            self._delay = self._min_refresh_s
        capacity = dt * self._cores
        return [100.0 * cpu_total / capacity, rss, float(count), float(alive), float(busy),
                100.0 * workers_cpu / capacity, runq / 1e6 / dt, workers_runq / 1e6 / dt, switches / dt]


def _read_process(member: _Member) -> tuple[float, int] | None:
    """(CPU seconds, RSS bytes) of a live process, None once it exited (zombies included)."""
    if procfs.AVAILABLE:
        return procfs.process(member.proc.pid, member.stat)  # no kept file: read by path
    proc = member.proc
    try:
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            t = proc.cpu_times()
            return t.user + t.system, proc.memory_info().rss
    except psutil.Error:
        return None


def _contention(member: _Member) -> tuple[float, float]:
    """Its main thread's run-queue delay (ns) and involuntary context switches since the last read (0 the first
    time, and off Linux): time it was ready to run but another task had the CPU."""
    pid = member.proc.pid
    try:
        runq = int(procfs._read(f"/proc/{pid}/schedstat").split()[1])
        status = procfs._read(f"/proc/{pid}/status")
        at = status.index(b"nonvoluntary_ctxt_switches:")
        nvcsw = int(status[at + 27:].split(b"\n", 1)[0])
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    waited = 0.0 if member.runq_ns is None else max(runq - member.runq_ns, 0)
    switched = 0.0 if member.nvcsw is None else max(nvcsw - member.nvcsw, 0)
    member.runq_ns, member.nvcsw = runq, nvcsw
    return float(waited), float(switched)


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a process that exited but was not reaped yet)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
