"""The training thread's run-queue delay: how long it was runnable but waiting for a CPU (another process, a
container's CPU limit, a hypervisor's steal), read from /proc at step boundaries so each step can say how much
of its time was not the job's own (docs/format.md, `runq_us`)."""

from __future__ import annotations

import os

from stallwatch.fds import above_standard

PATH = "/proc/thread-self/schedstat"  # run time, run-queue delay (ns), timeslices — of the thread that opens it
_getpid = os.getpid
_pread = os.pread


class RunQueueClock:
    """The run-queue delay so far (ns) of the thread that first read it: the file is kept open (one pread a
    read, ~2 µs) and names that thread whichever thread reads it later. A forked child opens its own; where
    the file does not exist (not Linux, no schedstats) every read is -1."""

    __slots__ = ("_fd", "_pid")

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = 0

    def read(self) -> int:
        """Nanoseconds waited on a run queue so far; -1 when unknown."""
        if _getpid() != self._pid:
            self._open()
        fd = self._fd
        if fd is None:
            return -1
        try:
            return int(_pread(fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return -1

    def _open(self) -> None:
        # A forked child's copy names its parent's thread: its own file replaces it (the inherited fd is ours).
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._pid = _getpid()
        try:
            self._fd = above_standard(os.open(PATH, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            self._fd = None

    def close(self) -> None:
        if self._fd is not None and self._pid == _getpid():
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None
