"""A run's location on S3: a caller beside the job (the live rules) bounds each request by its patience
(`--upload-timeout`), so a store that never answers holds it for that long, not for the defaults' two tries."""

from __future__ import annotations

import pytest

from stallwatch.store.location import S3_CONNECT_TIMEOUT_S, S3_REQUEST_TIMEOUT_S, RunLocation
from stallwatch.store.reader import open_run
from tests.store.s3_server import BlackHole, s3_environment


def _timeouts(location: RunLocation) -> dict[str, float]:
    """The S3 client's timeouts, as pyarrow would rebuild the filesystem with them."""
    kwargs = location.fs.__reduce__()[1][0]
    return {k: kwargs[k] for k in ("connect_timeout", "request_timeout")}


@pytest.fixture
def endpoint(monkeypatch, tmp_path):
    hole = BlackHole()
    for key, value in s3_environment(f"http://127.0.0.1:{hole.port}", tmp_path).items():
        monkeypatch.setenv(key, value)
    yield hole
    hole.close()


def test_patience_cuts_the_timeouts_only_below_the_defaults(endpoint):
    defaults = {"connect_timeout": S3_CONNECT_TIMEOUT_S, "request_timeout": S3_REQUEST_TIMEOUT_S}
    assert _timeouts(RunLocation("s3://bkt/run")) == defaults
    assert _timeouts(RunLocation("s3://bkt/run", patience_s=30)) == defaults  # the default --upload-timeout
    assert _timeouts(RunLocation("s3://bkt/run", patience_s=2)) == {"connect_timeout": 2.0, "request_timeout": 2.0}


def test_a_store_that_never_answers_is_an_error_within_the_patience_not_a_hang(endpoint):
    with pytest.raises(OSError):
        open_run("s3://bkt/run", patience_s=1)
    assert endpoint.accepted > 0  # it was asked, and gave no answer
