"""The token on a bind beyond loopback: refused without it; `?token=` once becomes an HttpOnly SameSite=Strict
cookie (and leaves the address bar); a cookie or a Bearer header then works; a wrong token never does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stallwatch.present.dashboard.security import Policy
from stallwatch.present.dashboard.server import DashboardError, policy_for
from tests.present.dashboard.conftest import Dashboard, request, start_dashboard


@pytest.fixture(scope="module")
def guarded(runs_root: Path) -> Iterator[Dashboard]:
    d = start_dashboard(runs_root, host="0.0.0.0", token="s3cret-token")
    yield d
    d.stop()


def test_requests_without_the_token_are_refused(guarded: Dashboard) -> None:
    for path in ("/", "/api/runs", "/api/run/run-a/summary", "/api/run/run-a/live", "/static/dashboard.js"):
        status, _, body = guarded.get(path, auth=False)
        assert status == 401, path
        assert b"s3cret" not in body
    status, _, _ = guarded.get("/api/runs?token=wrong", auth=False)
    assert status == 401
    status, _, _ = guarded.get("/api/runs", headers={"authorization": "Bearer wrong"})
    assert status == 401


def test_token_once_then_cookie_or_bearer(guarded: Dashboard) -> None:
    status, headers, _ = guarded.get("/?token=s3cret-token", auth=False)
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    jar = cookie.split(";", 1)[0]
    status, _, body = guarded.get("/", headers={"cookie": jar})
    assert status == 200 and b"s3cret" not in body  # never written into the page
    assert guarded.get("/api/runs", headers={"cookie": jar})[0] == 200
    assert guarded.get("/api/runs", headers={"authorization": "Bearer s3cret-token"})[0] == 200
    # beyond loopback the Host may be the machine's name: the token guards it
    assert guarded.get("/api/runs", headers={"authorization": "Bearer s3cret-token", "host": "gpu-box:8050"})[0] == 200
    # control requests still need the header, token or not
    status, _, _ = request(guarded.url + "api/run/run-b/profiling", method="POST", data=b"{}",
                           headers={"authorization": "Bearer s3cret-token", "content-type": "application/json"})
    assert status == 403


def test_every_bind_gets_a_token_loopback_too() -> None:
    """Loopback is no user boundary: user `nobody` POSTed a profiling request into a root-owned run's job."""
    for host in ("0.0.0.0", "127.0.0.1", "::1"):
        policy, token = policy_for(host, None)
        assert token and policy.token == token and len(token) >= 24
    assert policy_for("127.0.0.1", "mine") == (Policy("mine", "127.0.0.1"), "mine")
    with pytest.raises(DashboardError):
        policy_for("0.0.0.0", " ")
