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
