"""Progress of commands that take more than a moment (rules, report, timeline, upload, imports): a tqdm bar on a
terminal, a plain line every few seconds when stderr is a file or a pipe (CI logs), nothing with `--quiet`.
Always on stderr, never on stdout (which carries `--json` documents and, under `stallwatch run`, the job's
own output). The stages report progress through a plain callback, `(done, total)`, and know nothing of this."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, TextIO

LINE_EVERY_S = 5.0  # plain lines: at most one per this many seconds
QUIET = False  # set by the command line's --quiet

Callback = Callable[[int, int], None]


class Progress:
    """`update(done, total)` as work advances, `close()` at the end (also as a context manager)."""

    def __init__(self, what: str, *, unit: str = "", stream: TextIO | None = None, quiet: bool | None = None) -> None:
        self.what = what
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = QUIET if quiet is None else quiet
        self._bar: Any = None
        self._started = time.monotonic()
        self._last_line = self._started
        self._done = self._total = 0

    def update(self, done: int, total: int) -> None:
        self._done, self._total = done, total
        if self.quiet:
            return
        if _is_terminal(self.stream):
            if self._bar is None:
                from tqdm import tqdm

                sized = _columns(self.stream) > 0  # a terminal that reports no size gets 80 columns
                self._bar = tqdm(total=total, desc=f"stallwatch: {self.what}", unit=self.unit or "it",
                                 file=self.stream, leave=False, dynamic_ncols=sized, ncols=None if sized else 80,
                                 colour=None if os.environ.get("NO_COLOR") else "green")
            self._bar.total = total
            self._bar.n = done
            self._bar.refresh()
            return
        now = time.monotonic()
        if now - self._last_line >= LINE_EVERY_S:
            self._last_line = now
            print(f"stallwatch: {self.what}: {done}/{total}{' ' + self.unit if self.unit else ''}, "
                  f"{now - self._started:.0f} s", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False
