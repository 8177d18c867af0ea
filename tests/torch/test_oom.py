"""Which exceptions are allocation failures (the job's death explained at exit), and what is recorded: the
exception is read from sys.last_value, never caught or changed."""

from __future__ import annotations

import json
import sys

import torch

from stallwatch.torch.oom import CUDA, HOST, allocation_failure, record_at_exit


def test_allocation_failures_are_told_from_other_errors():
    assert allocation_failure(MemoryError()) == HOST
    assert allocation_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8")) \
        == HOST
    assert allocation_failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == CUDA
    try:
        try:
            raise MemoryError
        except MemoryError as inner:
            raise ValueError("batch failed") from inner
    except ValueError as outer:
        assert allocation_failure(outer) == HOST
    assert allocation_failure(RuntimeError("shape mismatch")) is None and allocation_failure(None) is None


def test_the_state_is_recorded_only_for_an_allocation_failure(monkeypatch):
    events: list[tuple] = []
    monkeypatch.setattr(sys, "last_value", ValueError("not memory"), raising=False)
    assert not record_at_exit(events.append, 1, 10) and events == []
    monkeypatch.setattr(sys, "last_value", MemoryError("no room"), raising=False)
    assert record_at_exit(events.append, 1, 10)
    (kind, name, *_rest, args), = events
    state = json.loads(args)
    assert (kind, name) == ("oom", "host") and state["error"] == "MemoryError: no room" and state["train_steps"] == 10
    assert state["rss_kb"] > 0 and state["vm_kb"] >= state["rss_kb"]
