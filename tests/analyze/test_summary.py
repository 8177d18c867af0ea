"""The job's fate from its node records: a crash, a kill, an interruption or a run still going is never read
as a success; older runs (no exit_signal recorded) read 128+N as signal N, as a shell does."""

from __future__ import annotations

import pytest

from stallwatch.analyze.summary import (
    FAILED,
    INTERRUPTED,
    KILLED,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    UNKNOWN,
    job_fate,
    node_fate,
)


@pytest.mark.parametrize("record, state, code, signal, interrupted", [
    ({"status": "finished", "exit_code": 0, "exit_signal": None}, SUCCEEDED, 0, None, False),
    ({"status": "finished", "exit_code": 3, "exit_signal": None}, FAILED, 3, None, False),
    ({"status": "finished", "exit_code": 137, "exit_signal": "SIGKILL", "interrupted": False}, KILLED, 137,
     "SIGKILL", True),
    ({"status": "finished", "exit_code": 130, "exit_signal": "SIGINT", "interrupted": True}, INTERRUPTED, 130,
     "SIGINT", True),
    ({"status": "finished", "exit_code": 143}, INTERRUPTED, 143, "SIGTERM", True),  # an older run's record
    ({"status": "finished", "exit_code": 130, "exit_signal": None}, FAILED, 130, None, False),  # exit(130) itself
    ({"status": "running"}, RUNNING, None, None, False),
    ({"status": "sampler_stopped"}, UNKNOWN, None, None, False),
    ({"status": "finished", "exit_code": "0"}, UNKNOWN, None, None, False),  # a wrong type is no exit code
])
def test_node_fate(record, state, code, signal, interrupted):
    fate = node_fate(record)
    assert (fate.state, fate.code, fate.signal, fate.interrupted) == (state, code, signal, interrupted)
    assert fate.ok == (state == SUCCEEDED)


def test_stop_training_on_request_is_its_own_state():
    fate = node_fate({"status": "finished", "exit_code": 0}, stop_reason="rule StepOutlier triggered")
    assert fate.state == STOPPED and "stopped training on request" in fate.phrase()


def test_the_worst_node_is_the_jobs_fate_and_is_named():
    fate = job_fate({"algo-1": {"status": "finished", "exit_code": 0},
                     "algo-2": {"status": "finished", "exit_code": 1},
                     "algo-3": {"status": "running"}})
    assert fate.state == FAILED and fate.node == "algo-2"
    assert fate.phrase() == "failed on node algo-2 with exit code 1"
    assert job_fate({"a": {"status": "finished", "exit_code": 0}}).node is None
    assert job_fate({}).state == UNKNOWN


@pytest.mark.parametrize("record, words", [
    ({"status": "finished", "exit_code": 0}, "exited with code 0"),
    ({"status": "finished", "exit_code": 137, "exit_signal": "SIGKILL"}, "was killed by SIGKILL (exit code 137)"),
    ({"status": "finished", "exit_code": 130, "exit_signal": "SIGINT", "interrupted": True},
     "was interrupted by SIGINT (exit code 130)"),
    ({"status": "running"}, "is still running"),
])
def test_phrases(record, words):
    assert node_fate(record).phrase() == words
