"""The training thread's run-queue delay: how long it was runnable but waiting for a CPU (another process, a
container's CPU limit, a hypervisor's steal), read from /proc at step boundaries so each step can say how much
of its time was not the job's own (docs/format.md, `runq_us`)."""

from __future__ import annotations

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
