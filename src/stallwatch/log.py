"""One logger for the package, and "say it once" helpers so a failing disk or GPU is one line, not a flood."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("stallwatch")
_said: set[str] = set()
_lock = threading.Lock()


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
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("stallwatch: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
