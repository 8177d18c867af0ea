"""One logger for the package, and "say it once" helpers so a failing disk or GPU is one line, not a flood."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("stallwatch")
_said: set[str] = set()
_lock = threading.Lock()
PREFIX = "stallwatch: %(message)s"


class _Fallback(logging.Handler):
    """In the training job, where nobody configured logging, Python's last-resort handler would print our warnings
    bare ("no DataLoader iteration seen: …"): this one prints them as `stallwatch: …` instead, and stands aside
    wherever another handler will show them (the job's own logging set-up, the command line's)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(PREFIX))

    def emit(self, record: logging.LogRecord) -> None:
        if any(h is not self for h in logger.handlers) or (logger.propagate and _ancestors_handle()):
            return
        import sys

        stream = sys.stderr
        if stream is None:
            return
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # a closed stderr: nothing to say it on
            pass


def _ancestors_handle() -> bool:
    parent = logger.parent
    while parent is not None:
        if parent.handlers:
            return True
        if not parent.propagate:
            return False
        parent = parent.parent
    return False


_fallback = _Fallback()
logger.addHandler(_fallback)


def warn_once(key: str, message: str, *args: object, level: int = logging.WARNING) -> bool:
    """Log `message` the first time `key` is seen in this process; True when it was logged."""
    with _lock:
        if key in _said:
            return False
        _said.add(key)
    logger.log(level, message, *args)
    return True


def forget(key: str) -> None:
    """Allow `key` to be said again (a condition cleared, e.g. the endpoint came back)."""
    with _lock:
        _said.discard(key)


def configure_cli_logging(level: int = logging.INFO) -> None:
    """Plain `stallwatch: message` lines on stderr, used by the command line and the sampler process."""
    if any(h is not _fallback for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(PREFIX))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
