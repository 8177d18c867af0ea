"""Safe by default: the Host header is checked (DNS rebinding reaches loopback-only servers too); with a token,
every request needs it (`?token=` once, exchanged for an HttpOnly SameSite=Strict cookie, or `Authorization:
Bearer`), compared in constant time and never written into a page; control requests (POST) also need a custom
header and a same Origin (CSRF); every response carries a Content-Security-Policy without inline scripts."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qsl, urlencode

COOKIE = "stallwatch_token"
CONTROL_HEADER = "x-stallwatch"
# style-src 'unsafe-inline': BokehJS (the charts) styles its shadow DOM with <style> elements; scripts stay 'self'
# alone, and nothing read from a run reaches the page as markup (textContent only)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}

ASGI = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
                Awaitable[None]]


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Policy:
    token: str | None
    bind_host: str  # what the server listens on: a loopback bind accepts only loopback Host names
    allowed_hosts: frozenset[str] = frozenset()  # extra Host names (without port) the page may be reached by

    def host_ok(self, host_header: str) -> bool:
        name = _host_name(host_header)
        if name is None:
            return False
        if name in self.allowed_hosts or is_loopback(name):
            return True
        if is_loopback(self.bind_host):
            return False
        # Beyond loopback a token is required anyway; the names the server is bound to are fine.
        return self.token is not None

    def token_ok(self, given: str | None) -> bool:
        return self.token is None or (given is not None and hmac.compare_digest(given.encode(), self.token.encode()))


def _host_name(header: str) -> str | None:
    header = header.strip().lower()
    if not header:
        return None
    if header.startswith("["):
        end = header.find("]")
        return header[:end + 1] if end > 0 else None
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware enforcing the Policy in front of the app."""

    def __init__(self, app: ASGI, policy: Policy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not self.policy.host_ok(headers.get("host", "")):
            await _plain(send, 421, "unknown Host: open the dashboard by the address it printed")
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        given_query = query.get("token")
        given = given_query or _bearer(headers.get("authorization")) or _cookie(headers.get("cookie"))
        if not self.policy.token_ok(given):
            await _plain(send, 401, "this dashboard needs its token: open the URL it printed (…?token=…)")
            return
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            origin = headers.get("origin")
            same = origin is None or _host_name(origin.split("://", 1)[-1]) == _host_name(headers.get("host", ""))
            if headers.get(CONTROL_HEADER) != "1" or not same:
                await _plain(send, 403, "control requests need the page's own origin and its X-Stallwatch header")
                return
        if self.policy.token and given_query and method == "GET" and scope.get("path", "/") == "/":
            # The token from the printed URL becomes a cookie and leaves the address bar.
            rest = urlencode([(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode()) if k != "token"])
            await _redirect(send, "/" + (f"?{rest}" if rest else ""), self.policy.token)
            return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                extra = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                         (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]
                message = {**message, "headers": list(message.get("headers", [])) + extra}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _bearer(header: str | None) -> str | None:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip()
    return None


def _cookie(header: str | None) -> str | None:
    if not header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else None


async def _plain(send: Any, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"content-security-policy", CSP.encode())]})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Any, location: str, token: str) -> None:
    cookie = f"{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/"
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode()),
                            (b"content-length", b"0"), (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": b""})
