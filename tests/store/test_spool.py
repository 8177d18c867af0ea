"""SpoolingSink against a real S3-protocol server (moto, on loopback) and against endpoints that are down."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stallwatch.store import spool as spool_mod
from stallwatch.store.location import RunLocation
from stallwatch.store.spool import SpoolingSink
from tests.store.s3_server import S3Server, closed_port, s3_environment, start_s3_server

HANG_GUARD_S = 60.0


class RecordingLocation(RunLocation):
    """A real remote RunLocation that also notes which uploads and deletes succeeded, in order."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.done: list[tuple[str, str]] = []

    def write_atomic(self, rel: str, data: bytes) -> None:
        super().write_atomic(rel, data)
        self.done.append(("put", rel))

    def delete(self, rel: str) -> None:
        super().delete(rel)
        self.done.append(("delete", rel))


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.lines.append(record.getMessage())


@pytest.fixture
def warnings() -> Iterator[Captured]:
    """stallwatch's warnings, whether or not CLI logging (propagate=False) was set up in this process."""
    handler = Captured()
    log = logging.getLogger("stallwatch")
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)


def wait_until(cond, timeout: float = HANG_GUARD_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def use_endpoint(monkeypatch: pytest.MonkeyPatch, endpoint: str, cache: Path) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    for k, v in s3_environment(endpoint, cache).items():
        monkeypatch.setenv(k, v)


def test_files_reach_the_bucket_in_order_and_the_spool_is_removed(s3_server: S3Server, s3_env, bucket, tmp_path):
    remote = RecordingLocation(f"s3://{bucket}/runs/a")
    spool_dir = tmp_path / "spool" / "node"
    sink = SpoolingSink(remote, spool_dir)
    names = [f"system/n/part-{i:016d}-{i:016d}.parquet" for i in range(8)]
    for i, rel in enumerate(names):
        sink.write_atomic(rel, f"payload {i}".encode())
    sink.write_atomic("nodes/n.json", b'{"v": 1}')
    sink.write_atomic("nodes/n.json", b'{"v": 2}')  # rewritten before upload: the newest content wins

    assert sink.close(timeout_s=30) is True
    assert remote.done == [("put", rel) for rel in names] + [("put", "nodes/n.json")] * 2
    assert s3_server.keys(bucket, "runs/a/") == sorted(["runs/a/nodes/n.json"] + [f"runs/a/{n}" for n in names])
    assert s3_server.get(bucket, "runs/a/system/n/part-0000000000000003-0000000000000003.parquet") == b"payload 3"
    assert s3_server.get(bucket, "runs/a/nodes/n.json") == b'{"v": 2}'
    assert not spool_dir.exists(), list(spool_dir.rglob("*"))


def test_delete_after_upload_removes_the_remote_file(s3_server: S3Server, s3_env, bucket, tmp_path):
    remote = RecordingLocation(f"s3://{bucket}/runs/d")
    sink = SpoolingSink(remote, tmp_path / "spool")
    sink.write_atomic("system/n/part-1.parquet", b"one")
    wait_until(lambda: sink.backlog == 0, what="the first upload")
    sink.delete("system/n/part-1.parquet")
    sink.write_atomic("system/n/seg-1.parquet", b"seg")
    assert sink.close(timeout_s=30)
    assert remote.done == [("put", "system/n/part-1.parquet"), ("delete", "system/n/part-1.parquet"),
                           ("put", "system/n/seg-1.parquet")]
    assert s3_server.keys(bucket, "runs/d/") == ["runs/d/system/n/seg-1.parquet"]


def test_create_exclusive_leaves_an_existing_remote_file_alone(s3_server: S3Server, s3_env, bucket, tmp_path):
    first = RunLocation(f"s3://{bucket}/runs/c")
    first.write_atomic("run.json", b"first node")
    sink = SpoolingSink(RunLocation(f"s3://{bucket}/runs/c"), tmp_path / "spool")
    sink.create_exclusive("run.json", b"second node")
    sink.create_exclusive("config.json", b"cfg")
    assert sink.close(timeout_s=30)
    assert s3_server.get(bucket, "runs/c/run.json") == b"first node"
    assert s3_server.get(bucket, "runs/c/config.json") == b"cfg"


def test_endpoint_down_keeps_data_in_the_spool_and_close_gives_up(monkeypatch, tmp_path, warnings):
    use_endpoint(monkeypatch, f"http://127.0.0.1:{closed_port()}", tmp_path / "cache")
    spool_dir = tmp_path / "spool" / "node"
    sink = SpoolingSink(RunLocation("s3://down-bucket/runs/x"), spool_dir)

    t0 = time.monotonic()
    for i in range(5):
        sink.write_atomic(f"system/n/part-{i}.parquet", b"x" * 100)
    writes_s = time.monotonic() - t0
    assert writes_s < 10, f"writes blocked for {writes_s:.1f} s"  # hang guard: they only touch local disk
    assert sorted(p.name for p in (spool_dir / "system" / "n").iterdir()) == [f"part-{i}.parquet" for i in range(5)]
    wait_until(lambda: any("cannot reach" in line for line in warnings.lines), what="the first failed upload")

    t0 = time.monotonic()
    ok = sink.close(timeout_s=1.5)
    took = time.monotonic() - t0
    assert ok is False
    assert took < 1.5 + 10, f"close(1.5) took {took:.1f} s"
    gave_up = [line for line in warnings.lines if "could not be uploaded" in line]
    assert len(gave_up) == 1, warnings.lines
    assert str(spool_dir) in gave_up[0] and "5 file(s)" in gave_up[0]
    # one line for the outage however many retries there were, one for giving up
    assert len(warnings.lines) == 2, warnings.lines
    assert sorted(p.name for p in (spool_dir / "system" / "n").iterdir()) == [f"part-{i}.parquet" for i in range(5)]
    sink._thread.join(timeout=HANG_GUARD_S)
    assert not sink._thread.is_alive(), "the uploader goes on after close() gave up"


def test_backlog_is_uploaded_in_order_when_the_endpoint_comes_back(s3_server: S3Server, monkeypatch, tmp_path,
                                                                   warnings):
    port = closed_port()
    use_endpoint(monkeypatch, f"http://127.0.0.1:{port}", tmp_path / "cache")
    bucket = s3_server.make_bucket(f"comes-back-{port}")  # moto servers of one process share their state
    remote = RecordingLocation(f"s3://{bucket}/runs/r")
    spool_dir = tmp_path / "spool" / "node"
    sink = SpoolingSink(remote, spool_dir)

    names = [f"system/n/part-{i:02d}.parquet" for i in range(6)]
    for rel in names:
        sink.write_atomic(rel, rel.encode())
    wait_until(lambda: any("cannot reach" in line for line in warnings.lines), what="the first failed upload")
    # A part compacted away while the endpoint is down is never uploaded (and never needs deleting).
    sink.delete(names[3])
    assert not (spool_dir / names[3]).exists()
    sink.write_atomic("system/n/seg-00.parquet", b"segment")
    sink.delete(names[1])
    assert remote.done == []

    late = start_s3_server(port)  # the endpoint comes back on the same address
    try:
        wait_until(lambda: sink.backlog == 0, what="the backlog to drain after the endpoint came back")
        assert sink.close(timeout_s=10)
    finally:
        late.stop()
    expected = [n for n in names if n not in (names[1], names[3])] + ["system/n/seg-00.parquet"]
    assert remote.done == [("put", rel) for rel in expected]
    assert sink.uploaded == len(expected)
    assert s3_server.keys(bucket, "runs/r/") == sorted(f"runs/r/{rel}" for rel in expected)
    assert any("reachable again" in line for line in warnings.lines), warnings.lines
    assert not spool_dir.exists()


def test_close_retries_at_once_when_the_endpoint_is_back_during_a_long_back_off(
        s3_server: S3Server, monkeypatch, tmp_path, warnings):
    monkeypatch.setattr(spool_mod, "BACKOFF_START_S", 120.0)  # the next retry would be 60 s … 180 s away
    port = closed_port()
    use_endpoint(monkeypatch, f"http://127.0.0.1:{port}", tmp_path / "cache")
    bucket = s3_server.make_bucket(f"back-off-{port}")
    sink = SpoolingSink(RunLocation(f"s3://{bucket}/runs/b"), tmp_path / "spool")
    sink.write_atomic("run.json", b"{}")
    wait_until(lambda: any("cannot reach" in line for line in warnings.lines), what="the first failed upload")
    late = start_s3_server(port)
    try:
        assert sink.close(timeout_s=20), "close() waited out the back-off instead of retrying"
    finally:
        late.stop()
    assert s3_server.keys(bucket, "runs/b/") == ["runs/b/run.json"]


def test_live_counts_rewritten_while_the_store_is_behind_are_queued_once(monkeypatch, tmp_path, warnings):
    """The live counts are rewritten every flush interval: a slow store gets the newest, not a growing backlog."""
    use_endpoint(monkeypatch, f"http://127.0.0.1:{closed_port()}", tmp_path / "cache")
    sink = SpoolingSink(RunLocation("s3://down-bucket/runs/x"), tmp_path / "spool" / "node")
    sink.write_atomic("system/n/part-0.parquet", b"x")
    for i in range(10):
        sink.write_atomic("live/n.json", b"%d" % i)
        sink.write_atomic("nodes/n.json", b"%d" % i)
    assert sink.backlog <= 1 + 1 + 10  # the head, one live put, every node record
    assert (tmp_path / "spool" / "node" / "live" / "n.json").read_bytes() == b"9"
    sink.close(timeout_s=0.5)
    sink._thread.join(timeout=HANG_GUARD_S)  # a try still under way ends here, not in a later test's log
    assert not sink._thread.is_alive()
    # nothing says "retrying" once close() has said it gave up and where the files are
    gave_up = [i for i, line in enumerate(warnings.lines) if "could not be uploaded" in line]
    assert gave_up and not [line for line in warnings.lines[gave_up[0]:] if "cannot reach" in line], warnings.lines
