"""Real dashboards for the tests: uvicorn serving the app on a free loopback port, in a thread of the test
process, over runs generated in the store's own format (tests/present/report/_full_runs.py: a planted CPU
bottleneck on the first node, planted slow steps, an operator window)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stallwatch.present.dashboard.app import create_app
from stallwatch.present.dashboard.server import listen, open_served
from tests.present.generated_run import training_run
from tests.present.report._full_runs import IMG, full_run


@dataclass
class Dashboard:
    url: str
    port: int
    root: Path
    server: Any
    thread: threading.Thread
    token: str

    @property
    def auth(self) -> dict[str, str]:
        """What a script sends (a browser gets a cookie from the printed URL instead)."""
        return {"authorization": f"Bearer {self.token}"}

    def link(self, fragment: str = "") -> str:
        """The URL the dashboard prints: its token once, then a cookie."""
        return f"{self.url}?token={self.token}{fragment}"

    def get(self, path: str, headers: dict[str, str] | None = None, *,
            auth: bool = True) -> tuple[int, dict[str, str], bytes]:
        return request(self.url.rstrip("/") + path, headers=headers, auth=auth)

    def json(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


_TOKENS: dict[int, str] = {}  # port -> token of the dashboards the tests started


def request(url: str, *, method: str = "GET", data: bytes | None = None,
            headers: dict[str, str] | None = None, auth: bool = True) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request; to a dashboard the tests started, with its token unless the headers carry credentials
    (or `auth` is False: a request without any)."""
    headers = dict(headers or {})
    token = _TOKENS.get(urllib.parse.urlsplit(url).port or 0)
    if auth and token and "?token=" not in url and not {"authorization", "cookie"} & {k.lower() for k in headers}:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def start_dashboard(root: Path, *, host: str = "127.0.0.1", token: str | None = None) -> Dashboard:
    import uvicorn

    served = open_served(str(root))
    listening, policy = listen(host, 0, token)
    app = create_app(served, policy)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening.sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.05)
    assert policy.token
    _TOKENS[listening.port] = policy.token
    return Dashboard(f"http://127.0.0.1:{listening.port}/", listening.port, root, server, thread, policy.token)


@pytest.fixture(scope="package")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of runs: `run-a` (2 nodes × 2 ranks, planted findings), `run-b` (1 node, healthy) and
    `run-xss` (its command is an HTML payload)."""
    root = tmp_path_factory.mktemp("dash-runs")
    full_run(root / "run-a", nodes=("algo-1", "algo-2"), ranks=2)
    training_run(root / "run-b")
    full_run(root / "run-xss", command=["python", IMG], operators=False)
    return root


@pytest.fixture(scope="package")
def dashboard(runs_root: Path) -> Iterator[Dashboard]:
    d = start_dashboard(runs_root)
    yield d
    d.stop()
