"""The training thread's run-queue delay: how long it was runnable but waiting for a CPU (another process, a
container's CPU limit, a hypervisor's steal), read from /proc at step boundaries so each step can say how much
of its time was not the job's own (docs/format.md, `runq_us`)."""

from __future__ import annotations

import os
import threading
import time

from stallwatch.fds import KeptFile

PATH = "/proc/thread-self/schedstat"  # run time, run-queue delay (ns), timeslices — of the thread that opens it


class RunQueueClock:
    """The run-queue delay so far (ns) of the thread that first read it: the file is kept open (one pread a
    read, ~2 µs) and names that thread whichever thread reads it later. A forked child opens its own; where
    the file does not exist (not Linux, no schedstats) every read is -1."""

    __slots__ = ("_file",)

    def __init__(self) -> None:
        self._file = KeptFile(PATH)

    def read(self) -> int:
        """Nanoseconds waited on a run queue so far; -1 when unknown."""
        file = self._file
        if file.stale():
            file.open()
        data = file.read(64)
        if data is None:
            return -1
        try:
            return int(data.split()[1])
        except (ValueError, IndexError):
            return -1

    def close(self) -> None:
        self._file.close()


PEERS_MAX = 32  # native threads read at most (a torch CPU job's intra-op pool on a 33-core node and under)
PEERS_REFRESH_NS = 5_000_000_000  # how often the set of native threads is listed again (pools grow, threads end)
PEER_READ_COST_US = 2  # one pread of a kept /proc file


class PeerRunQueue:
    """The run-queue delay of the training thread's native peers: the threads that Python did not start (torch's
    intra-op OpenMP pool, MKL's, a BLAS library's). The training thread spins at a parallel region's barrier while
    a preempted peer waits for a CPU, so on a busy machine its own time grows by a delay it never queued for itself
    (docs/format.md, `peer_runq_us`). Each peer's schedstat is kept open (one pread, ~2 µs, per peer per read); the
    threads are listed again every few seconds; Python's threads (the job's own, the DataLoader's pin-memory
    thread, stallwatch's) are left out: they do not hold the training thread at a barrier."""

    __slots__ = ("_files", "_last", "_listed_ns", "_owner", "_pid")

    def __init__(self) -> None:
        self._files: dict[int, KeptFile] = {}
        self._last: dict[int, int] = {}  # tid -> its delay (ns) at the last read
        self._listed_ns = 0
        self._pid = 0
        self._owner = 0

    @property
    def peers(self) -> int:
        return len(self._files)

    def read(self) -> int:
        """The largest delay (µs) any peer accrued since the last read; -1 where none was read then (the first
        read, a new peer, a forked child, not Linux). Peers wait side by side: the slowest one holds the barrier."""
        now = _monotonic_ns()
        if _getpid() != self._pid or now - self._listed_ns > PEERS_REFRESH_NS:
            self._list(now)
        worst = -1
        last = self._last
        ended = []
        for tid, file in self._files.items():
            data = file.read(64)
            if data is None:
                ended.append(tid)  # the thread ended: its file names it forever, even if its tid comes back
                continue
            try:
                ns = int(data.split()[1])
            except (ValueError, IndexError):
                continue
            before = last.get(tid, -1)
            last[tid] = ns
            if before >= 0:
                worst = max(worst, (ns - before) // 1000)
        for tid in ended:  # the next listing opens a thread that took the same tid afresh
            self._files.pop(tid).close()
            last.pop(tid, None)
        return worst

    def _list(self, now: int) -> None:
        """List the process's native threads again (keeping the files and readings of those still there)."""
        self._listed_ns = now
        if _getpid() != self._pid:  # a forked child: its parent's threads are not its own
            self.close(inherited=True)
            self._pid, self._owner = _getpid(), _native_id()
        try:
            tids = {int(t) for t in _listdir("/proc/self/task") if t.isdigit()}
        except OSError:
            tids = set()
        python = {t.native_id for t in _threads() if t.native_id is not None}
        keep = sorted(tids - python - {self._owner})[:PEERS_MAX]
        for tid in [t for t in self._files if t not in keep]:
            self._files.pop(tid).close()
            self._last.pop(tid, None)
        for tid in keep:
            if tid not in self._files:
                file = self._files[tid] = KeptFile(f"/proc/self/task/{tid}/schedstat")
                file.open()

    def close(self, inherited: bool = False) -> None:
        for file in self._files.values():
            file.close(inherited=inherited)
        self._files.clear()
        self._last.clear()


def _threads() -> list[threading.Thread]:
    return threading.enumerate()


_monotonic_ns = time.monotonic_ns
_getpid = os.getpid
_native_id = threading.get_native_id
_listdir = os.listdir
