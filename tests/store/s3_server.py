"""A real S3-protocol server on loopback (moto's server mode) for the S3 tests, and the environment that
points stallwatch (and its subprocesses) at it. No client is patched: everything talks HTTP to the server."""

from __future__ import annotations

import logging
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class S3Server:
    """One moto server. Servers in one process share moto's state, so a bucket made on one is seen on all."""

    host: str
    port: int
    _server: object = field(repr=False, default=None)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Object keys, without the empty 'dir/' markers pyarrow leaves when it deletes a directory's last file."""
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
        return sorted(out)

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def stop(self) -> None:
        self._server.stop()  # type: ignore[attr-defined]


def start_s3_server(port: int = 0) -> S3Server:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request in the test output
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    host, bound = server.get_host_and_port()
    return S3Server(host, int(bound), server)


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed): connections to it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BlackHole:
    """A TCP server that accepts connections and never answers: the slowest possible endpoint."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self.accepted = 0
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)  # held open, never read from, never answered

    def close(self) -> None:
        self._sock.close()
        for c in self._conns:
            c.close()


class SlowProxy:
    """A TCP proxy to `port` that holds each chunk a client sends for `delay_s` before passing it on: an S3
    endpoint that answers every request, slowly (a loaded or far-away store)."""

    def __init__(self, port: int, delay_s: float) -> None:
        self.target, self.delay_s = port, delay_s
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self._open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            self._open += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, self.delay_s), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, 0.0), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
        import time

        try:
            while data := src.recv(1 << 16):
                if delay_s:
                    time.sleep(delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._sock.close()
        for s in self._open:
            s.close()


def s3_environment(endpoint: str, cache_dir: Path) -> dict[str, str]:
    """What a subprocess (and the test process) needs to reach `endpoint`; the spool lives under cache_dir."""
    return {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "XDG_CACHE_HOME": str(cache_dir)}


def unique_bucket(hint: str) -> str:
    """A valid, unused bucket name (3-63 chars of a-z0-9-), readable in failures."""
    base = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")[:40] or "bkt"
    return f"{base}-{uuid.uuid4().hex[:8]}"


def spool_files(cache_dir: Path) -> list[Path]:
    root = cache_dir / "stallwatch" / "spool"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


# -- fixtures (imported by tests/store/conftest.py) ----------------------------------------------------------

@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment for the server, set in this process too (for open_run) and returned for subprocesses."""
    env = s3_environment(s3_server.endpoint, tmp_path / "cache")
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> str:
    """A fresh bucket on the server for this test."""
    return s3_server.make_bucket(unique_bucket(request.node.name.replace("test_", "", 1)))
