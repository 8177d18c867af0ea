"""Fifty clients asking one question at once cost one computation: concurrent askers wait for it, later ones get
the kept answer until the run's stamp changes; a failure reaches every asker and is not kept."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from stallwatch.present.dashboard.answers import Answers


def test_concurrent_askers_share_one_computation() -> None:
    answers = Answers()
    calls = []
    gate = threading.Event()

    def compute() -> bytes:
        calls.append(1)
        gate.wait(5)
        return b"doc"

    with ThreadPoolExecutor(50) as pool:
        futures = [pool.submit(answers.get, "summary", (1,), compute) for _ in range(50)]
        time.sleep(0.2)
        gate.set()
        assert {f.result() for f in futures} == {b"doc"}
    assert len(calls) == 1 and answers.computed == 1 and answers.shared == 49
    assert answers.get("summary", (1,), compute) == b"doc" and len(calls) == 1
    assert answers.get("summary", (2,), lambda: b"new") == b"new"  # the run changed


def test_a_failure_reaches_every_asker_and_is_not_kept() -> None:
    answers = Answers()

    def boom() -> bytes:
        raise ValueError("bad")

    with pytest.raises(ValueError):
        answers.get("q", (1,), boom)
    assert answers.get("q", (1,), lambda: b"ok") == b"ok"
