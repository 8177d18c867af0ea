"""A command started with stdin, stdout or stderr closed (`stallwatch run -- python train.py <&-`) must
behave as without stallwatch: the job finds them closed, and nothing stallwatch opens (a pipe, a socket,
a file) takes descriptor 0, 1 or 2 meanwhile, where the job would inherit it as its standard stream."""

from __future__ import annotations

import fcntl
import os
import sys

STANDARD_FDS = (0, 1, 2)


def hold_closed_standard_fds() -> frozenset[int]:
    """Hold each closed standard descriptor with /dev/null, close-on-exec: children (the job, the sampler)
    still start without it, and this process's own output to it goes nowhere, as the caller asked.
    Returns the descriptors that were closed."""
    closed = set()
    for fd in STANDARD_FDS:
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):
        got = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        if got != fd:
            os.dup2(got, fd, inheritable=False)
            os.close(got)
    # Python starts with None for a closed stream, and print(file=None) writes to stdout: the summary meant
    # for a closed stderr would land in the job's output. A descriptor open the wrong way (a launcher script
    # left read-only on 2) is left as it is for the job, but this process writes nothing to it.
    if sys.stdin is None or not _usable(0, write=False):
        sys.stdin = open(os.devnull, encoding="utf-8")
    if sys.stdout is None or not _usable(1, write=True):
        sys.stdout = open(os.devnull, "w", encoding="utf-8")
    if sys.stderr is None or not _usable(2, write=True):
        sys.stderr = open(os.devnull, "w", encoding="utf-8")
    return frozenset(closed)


def _usable(fd: int, *, write: bool) -> bool:
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return False
    return mode == os.O_RDWR or mode == (os.O_WRONLY if write else os.O_RDONLY)
