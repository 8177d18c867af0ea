"""Serving the dashboard: the socket is bound here (uvicorn would `sys.exit` on a taken port), so every way it
can fail to start — port taken, not a run, bucket unreachable, a public bind without a token — is one clear
line (`DashboardError`) for the command line to print."""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from stallwatch.present.dashboard.security import Policy, new_token

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050


class DashboardError(RuntimeError):
    """The dashboard cannot start; the message is the one line to print."""


@dataclass(frozen=True)
class Listening:
    sock: socket.socket
    host: str
    port: int
    url: str  # what to open (with the token when there is one)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free one)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise DashboardError(f"cannot listen on {host!r}: {exc.strerror or exc}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno in (98, 48):  # EADDRINUSE (Linux, macOS)
            raise DashboardError(f"port {port} on {host} is taken: pick another with --port "
                                 f"(or --port 0 for any free one)") from None
        raise DashboardError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(False)
    return sock


def policy_for(host: str, token: str | None) -> tuple[Policy, str]:
    """Every bind needs a token, generated unless given: loopback is no user boundary on a shared machine (any
    local user could otherwise steer the job's profiling), as notebook servers hold."""
    if token is not None and not token.strip():
        raise DashboardError("the token is empty: give one (STALLWATCH_DASHBOARD_TOKEN or --token-file), or "
                             "none and one is generated")
    token = new_token() if token is None else token.strip()
    return Policy(token=token, bind_host=host), token


def listen(host: str, port: int, token: str | None) -> tuple[Listening, Policy]:
    policy, token = policy_for(host, token)
    sock = bind(host, port)
    real_port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    url = f"http://{shown}:{real_port}/?token={token}"
    return Listening(sock, host, real_port, url), policy


def open_served(root: str, wait_s: float = 0.0) -> Any:
    """The runs to serve, or DashboardError saying why `root` is not something to serve. `wait_s`: how long to
    wait for a run that is about to be created (`stallwatch run --dashboard`)."""
    from stallwatch.present.dashboard.served import RootError, ServedRuns

    deadline = time.monotonic() + wait_s
    while True:
        try:
            served = ServedRuns(root)
        except (RootError, OSError, ValueError) as exc:
            if time.monotonic() < deadline:
                time.sleep(0.25)
                continue
            raise DashboardError(" ".join(str(exc).split())[:400]) from None
        if served.single or served.ids() or time.monotonic() >= deadline:
            return served
        time.sleep(0.25)


SERVER_PACKAGES = ("uvicorn", "starlette", "prometheus_client")  # the `dashboard` extra's, imported when serving


def missing_package() -> str | None:
    """The first package the server needs that does not import (the `dashboard` extra), None when all do: asked
    before anything starts, so a missing one is a line, not a traceback from inside `serve`."""
    import importlib

    for name in SERVER_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return exc.name or name
    return None


def serve(served: Any, listening: Listening, policy: Policy, *, open_browser: bool = False,
          announce: Any = None) -> None:
    """Run the server until interrupted (Ctrl-C, SIGTERM)."""
    import uvicorn

    from stallwatch.present.dashboard.app import create_app

    app = create_app(served, policy)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2,
                            server_header=False)
    server = uvicorn.Server(config)
    (announce or _announce)(listening)
    if open_browser:
        import webbrowser

        try:
            webbrowser.open(listening.url)
        except Exception:
            pass
    server.run(sockets=[listening.sock])


def _announce(listening: Listening) -> None:
    print(f"stallwatch dashboard: {listening.url}", file=sys.stderr, flush=True)
