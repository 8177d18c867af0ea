"""Findings off the request path: while the rules of a run whose results were never stored are evaluated, the
answer says so (with how far it got) instead of holding the request; the next answer has the findings."""

from __future__ import annotations

import time
from pathlib import Path

from stallwatch.present.dashboard.served import ServedRuns
from tests.present.generated_run import training_run


def test_pending_then_findings(tmp_path: Path) -> None:
    run = training_run(tmp_path / "run", n=200)
    state = ServedRuns(str(run)).state("run")
    with state.lock:  # the findings document needs the run's lock: held, the evaluation cannot finish
        first = state.findings.answer(state, wait_s=0.2)
    assert first["pending"]["stale"] is False and first["findings"] == [] and "elapsed_s" in first["pending"]
    deadline = time.monotonic() + 60
    doc = state.findings.answer(state)
    while "pending" in doc and time.monotonic() < deadline:
        doc = state.findings.answer(state)
    assert "pending" not in doc and len(doc["rules"]) >= 10 and doc["verdict"]
