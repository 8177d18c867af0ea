"""Fixtures shared by the collect tests."""

from __future__ import annotations

import logging

import pytest

from stallwatch import log


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, level: int = logging.DEBUG) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]


@pytest.fixture
def stallwatch_log(monkeypatch):
    """Every record of the `stallwatch` logger in this test; the "said once" memory starts empty."""
    monkeypatch.setattr(log, "_said", set())
    handler = _ListHandler()
    old_level = log.logger.level
    log.logger.addHandler(handler)
    log.logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        log.logger.removeHandler(handler)
        log.logger.setLevel(old_level)
