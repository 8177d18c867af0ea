"""The package's logger inside a training job, where nobody configured logging: its notices reach stderr as
`stallwatch: …` (Python's last-resort handler printed them bare), and stand aside where the job's own logging set-up
or the command line's shows them."""

from __future__ import annotations

import logging

from stallwatch.log import logger


def test_a_notice_without_any_logging_set_up_carries_the_prefix(capsys, monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    logger.warning("no DataLoader iteration seen: %s", "steps are delimited by optimizer.step()")
    assert capsys.readouterr().err == "stallwatch: no DataLoader iteration seen: steps are delimited by optimizer.step()\n"


def test_the_jobs_own_logging_set_up_shows_it_once(capsys, monkeypatch):
    root = logging.getLogger()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("JOB %(name)s %(message)s"))
    monkeypatch.setattr(root, "handlers", [handler])
    logger.warning("hello")
    assert capsys.readouterr().err == "JOB stallwatch hello\n"
