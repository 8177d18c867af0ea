"""Descriptors stallwatch opens inside the job keep out of 0, 1 and 2: a job started with stdin, stdout or stderr
closed must find them closed, not holding a file of ours (and printing into it)."""

from __future__ import annotations

import fcntl
import os


def above_standard(fd: int) -> int:
    """`fd`, or a close-on-exec copy of it numbered 3 or above when it took 0, 1 or 2 (the original closed)."""
    if fd > 2:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


class KeptFile:
    """A small /proc file kept open so that a read is one `pread` (~2 µs, in the training thread at each step),
    numbered above 0-2, and opened again in a forked child: the inherited descriptor names the parent's file
    (`/proc/self`, `/proc/thread-self` resolve when opened)."""

    __slots__ = ("_fd", "_pid", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = 0

    def stale(self) -> bool:
        """Not opened yet in this process (then `open()` before reading)."""
        return _getpid() != self._pid

    def open(self) -> None:
        self.close(inherited=True)
        self._pid = _getpid()
        try:
            self._fd = above_standard(os.open(self.path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            self._fd = None

    def read(self, size: int) -> bytes | None:
        """Its first `size` bytes; None where it cannot be read (not Linux, no such file, a closed descriptor)."""
        fd = self._fd
        if fd is None:
            return None
        try:
            return _pread(fd, size, 0)
        except OSError:
            return None

    def close(self, inherited: bool = False) -> None:
        """Close it (`inherited`: also a copy a forked child holds of its parent's, which is ours to close too)."""
        if self._fd is not None and (inherited or self._pid == _getpid()):
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None


_getpid = os.getpid
_pread = os.pread
