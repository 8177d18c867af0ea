"""The dashboard's web server: one Starlette app over a run or a folder of runs. JSON documents come from
`views` (the analysis layer), the page is static and offline, live updates are server-sent events from one
follower per run however many tabs watch it. Anything read from a run is data: it is escaped by the page,
never evaluated; run ids are plain names resolved under the served root."""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.config import LIVE_FIELDS, ConfigError, ProfilerConfig
from stallwatch.log import logger
from stallwatch.present import json_out
from stallwatch.present.dashboard import views
from stallwatch.store import layout, run_files
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run

POLL_S = 1.0  # how often a watched run's files are listed: a sample reaches the page within ~2 s of its flush
HEARTBEAT_S = 15.0  # keeps proxies from closing an idle event stream
COOKIE = "stallwatch_token"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


@dataclass
class _Watched:
    """One run as served: its analysis for the current state of its files, and the clients following it."""

    uri: str
    fingerprint: tuple = ()
    version: int = 0
    analysis: RunAnalysis | None = None
    report: tuple[int, bytes] | None = None  # (version, HTML) built for that version
    documents: dict[str, tuple[int, Any]] = field(default_factory=dict)  # request -> (version, document)
    clients: set[asyncio.Queue] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self) -> bool:
        """List the run's files; True when they changed (a new flush, a new node, a finished job)."""
        try:
            files = open_run(self.uri).files()
        except Exception:
            return False
        fp = tuple(sorted((f.path, f.size) for f in files))
        with self.lock:
            if fp == self.fingerprint:
                return False
            self.fingerprint, self.analysis = fp, None
            self.version += 1
            return True

    def current(self) -> RunAnalysis:
        with self.lock:
            if self.analysis is None:
                self.analysis = RunAnalysis(self.uri)
            return self.analysis


class Dashboard:
    """The served runs: `target` is one run or a folder (or bucket prefix) of runs."""

    def __init__(self, target: str, *, token: str | None = None, allowed_hosts: tuple[str, ...] = ()) -> None:
        self.target = target.rstrip("/") or target
        self.token = token
        self.allowed_hosts = {h.lower() for h in allowed_hosts} | {"127.0.0.1", "localhost", "[::1]"}
        self.single = run_files_exist(self.target)
        self._runs: dict[str, _Watched] = {}
        self._followers: dict[str, asyncio.Task] = {}

    # -- runs ---------------------------------------------------------------------------------------------
    def run_ids(self) -> list[dict[str, Any]]:
        from stallwatch.analyze.catalog import run_rows
        from stallwatch.store.catalog import list_runs

        rows = run_rows(list_runs(self.target))
        out = []
        for row in rows:
            doc = row.to_json()
            doc["id"] = self._id_of(row.uri)
            out.append(doc)
        return [d for d in out if d["id"] is not None]

    def _id_of(self, uri: str) -> str | None:
        if self.single:
            return layout.plain_name(self.target.rsplit("/", 1)[-1]) or "run"
        return layout.plain_name(uri.rstrip("/").rsplit("/", 1)[-1])

    def watched(self, run_id: str) -> _Watched | None:
        name = layout.plain_name(run_id)
        if name is None:
            return None
        if name in self._runs:
            return self._runs[name]
        uri = self.target if self.single else RunLocation(self.target).child(name).uri
        if self.single and name != self._id_of(self.target):
            return None
        if not run_files_exist(uri):
            return None
        w = self._runs[name] = _Watched(uri)
        w.refresh()
        return w

    async def follow(self, run_id: str, w: _Watched) -> None:
        """The one follower of a run: lists its files every POLL_S and tells every client what changed."""
        while w.clients:
            await asyncio.sleep(POLL_S)
            if await run_in_threadpool(w.refresh):
                for q in list(w.clients):
                    _offer(q, {"version": w.version})
        self._followers.pop(run_id, None)

    # -- access ---------------------------------------------------------------------------------------------
    def allowed(self, request: Request) -> Response | None:
        """None when the request may proceed, else the refusal. The Host header is checked even on
        loopback (DNS rebinding); with a token, it must come as a cookie, a Bearer header or `?token=`."""
        host = (request.headers.get("host") or "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in self.allowed_hosts:
            return PlainTextResponse("unknown host", status_code=421)
        if self.token is None:
            return None
        given = (request.cookies.get(COOKIE) or _bearer(request) or request.query_params.get("token") or "")
        if hmac.compare_digest(given.encode(), self.token.encode()):
            return None
        return PlainTextResponse("a token is needed: open the URL the dashboard printed", status_code=401)


def run_files_exist(uri: str) -> bool:
    try:
        return RunLocation(uri).exists(layout.RUN_JSON)
    except Exception:
        return False


def _int_param(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None and len(text) <= 20 else None
    except ValueError:
        return None
    return value if value is not None and 0 <= value < 1 << 62 else None


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization") or ""
    return auth[7:] if auth.lower().startswith("bearer ") else None


def _offer(q: asyncio.Queue, item: dict[str, Any]) -> None:
    """Bounded per client: a slow tab loses old notices and is told to resync, it never holds the server."""
    if q.full():
        try:
            q.get_nowait()
        except asyncio.QueueEmpty:
            pass
        item = {**item, "resync": True}
    q.put_nowait(item)


def _json(document: Any, status: int = 200) -> Response:
    return Response(json_out.dumps(document), status_code=status, media_type="application/json")


def _static(name: str) -> bytes:
    return resources.files("stallwatch.present.dashboard").joinpath("static", name).read_bytes()


_TYPES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8"}


def build_app(dashboard: Dashboard) -> Starlette:
    """The ASGI app: the page, its assets and the JSON API under /api."""

    def guard(handler: Any) -> Any:
        async def wrapped(request: Request) -> Response:
            refused = dashboard.allowed(request)
            if refused is not None:
                return refused
            if dashboard.token is not None and request.query_params.get("token"):
                # Exchange the token for a cookie and take it out of the address bar.
                response = RedirectResponse(request.url.path, status_code=303)
                response.set_cookie(COOKIE, dashboard.token, httponly=True, samesite="strict")
                return response
            response = await handler(request)
            response.headers["Content-Security-Policy"] = CSP
            response.headers["X-Content-Type-Options"] = "nosniff"
            response.headers["Cache-Control"] = "no-store"
            return response
        return wrapped

    async def page(request: Request) -> Response:
        return Response(_static("index.html"), media_type=_TYPES["index.html"])

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _TYPES or name == "index.html":
            return PlainTextResponse("not found", status_code=404)
        return Response(_static(name), media_type=_TYPES[name])

    async def runs(request: Request) -> Response:
        rows = await run_in_threadpool(dashboard.run_ids)
        return _json({"target": dashboard.target, "single": dashboard.single, "runs": rows})

    def with_run(compute: Any) -> Any:
        async def handler(request: Request) -> Response:
            w = dashboard.watched(request.path_params["run"])
            if w is None:
                return _json({"error": "no such run"}, 404)
            key = f"{request.url.path}?{request.url.query}"
            cached = w.documents.get(key)
            try:
                if cached is not None and cached[0] == w.version:
                    doc = cached[1]  # every tab asks the same after a notice: computed once per version
                else:
                    version = w.version
                    doc = await run_in_threadpool(compute, w, request)
                    if not isinstance(doc, Response):
                        if len(w.documents) > 64:
                            w.documents.clear()
                        w.documents[key] = (version, doc)
            except Exception as exc:  # one clear line for the page; the server goes on
                logger.warning("dashboard: %s failed (%s: %s)", request.url.path, type(exc).__name__, exc)
                return _json({"error": f"{type(exc).__name__}: {exc}"}, 500)
            return doc if isinstance(doc, Response) else _json({"version": w.version, **doc})
        return handler

    def overview(w: _Watched, request: Request) -> dict[str, Any]:
        return views.overview(w.current())

    def node(w: _Watched, request: Request) -> dict[str, Any]:
        analysis = w.current()
        name = request.path_params["node"]
        if name not in analysis.nodes:
            raise KeyError(f"no node {name!r} in this run")
        q = request.query_params
        lo, hi = _int_param(q.get("from")), _int_param(q.get("to"))
        return views.nodes(analysis, name, lo, hi) if lo is not None and hi is not None and hi > lo else \
            views.nodes(analysis, name)

    def ranks(w: _Watched, request: Request) -> dict[str, Any]:
        return views.ranks(w.current(), request.query_params.get("mode") or "TRAIN")

    def report(w: _Watched, request: Request) -> Response:
        from stallwatch.present.report import render_report

        with w.lock:
            cached = w.report if w.report is not None and w.report[0] == w.version else None
        if cached is None:
            data = render_report(w.current())
            cached = (w.version, data if isinstance(data, bytes) else data.encode())
            with w.lock:
                w.report = cached
        return Response(cached[1], media_type="text/html; charset=utf-8",
                        headers={"Content-Disposition": 'attachment; filename="report.html"'})

    async def control(request: Request) -> Response:
        """Profiling controls: the live fields of the run's config.json, validated, written atomically; the
        job picks them up at its next step (shown by the page once a window appears)."""
        if request.headers.get("x-stallwatch") != "1":
            return _json({"error": "missing X-Stallwatch header"}, 403)
        origin = request.headers.get("origin")
        if origin and origin.split("://", 1)[-1].lower() != (request.headers.get("host") or "").lower():
            return _json({"error": "cross-origin request refused"}, 403)
        w = dashboard.watched(request.path_params["run"])
        if w is None:
            return _json({"error": "no such run"}, 404)
        try:
            body = await request.json()
        except ValueError:
            return _json({"error": "the body is not JSON"}, 400)
        if not isinstance(body, dict) or not set(body) <= set(LIVE_FIELDS):
            return _json({"error": f"only these fields can change while the job runs: {', '.join(LIVE_FIELDS)}"}, 400)

        def apply() -> dict[str, Any]:
            location = RunLocation(w.uri)
            try:
                current = run_files.read_config(location)
            except FileNotFoundError:
                current = ProfilerConfig()
            # Parsed as a config file's fields are ("120:2", "1700000000/5", or null to clear).
            updated = ProfilerConfig.from_dict({**current.to_dict(), **{k: (v if v != "" else None)
                                                                       for k, v in body.items()}})
            run_files.write_config(location, updated)
            as_json = updated.to_dict()
            return {k: as_json.get(k) for k in body}

        try:
            changed = await run_in_threadpool(apply)
        except (ConfigError, TypeError, ValueError) as exc:
            return _json({"error": str(exc)}, 400)
        return _json({"changed": changed, "asked_us": int(time.time() * 1e6)})

    async def events(request: Request) -> Response:
        run_id = request.path_params["run"]
        w = dashboard.watched(run_id)
        if w is None:
            return _json({"error": "no such run"}, 404)
        queue: asyncio.Queue = asyncio.Queue(maxsize=8)
        w.clients.add(queue)
        if run_id not in dashboard._followers:
            dashboard._followers[run_id] = asyncio.create_task(dashboard.follow(run_id, w))

        async def stream() -> AsyncIterator[str]:
            try:
                yield f"data: {json.dumps({'version': w.version})}\n\n"
                while True:
                    if await request.is_disconnected():
                        return
                    try:
                        item = await asyncio.wait_for(queue.get(), timeout=HEARTBEAT_S)
                        yield f"data: {json.dumps(item)}\n\n"
                    except asyncio.TimeoutError:
                        yield ": heartbeat\n\n"
            finally:
                w.clients.discard(queue)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def metrics(request: Request) -> Response:
        """Prometheus: the served runs that are still running (a finished run's numbers no longer change)."""
        from prometheus_client import CONTENT_TYPE_LATEST

        from stallwatch.present.dashboard.metrics import exposition

        def collect() -> bytes:
            live = []
            for row in dashboard.run_ids():
                w = dashboard.watched(row["id"]) if row.get("status") == "running" else None
                if w is not None:
                    w.refresh()
                    live.append((row["id"], w.current()))
            return exposition(live)

        return Response(await run_in_threadpool(collect), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/", guard(page)),
        Route("/metrics", guard(metrics)),
        Route("/static/{name}", guard(asset)),
        Route("/api/runs", guard(runs)),
        Route("/api/runs/{run}/overview", guard(with_run(overview))),
        Route("/api/runs/{run}/nodes/{node}", guard(with_run(node))),
        Route("/api/runs/{run}/ranks", guard(with_run(ranks))),
        Route("/api/runs/{run}/report.html", guard(with_run(report))),
        Route("/api/runs/{run}/config", guard(control), methods=["POST"]),
        Route("/api/runs/{run}/events", guard(events)),
    ]
    return Starlette(routes=routes)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here (uvicorn exits the process when it cannot bind): OSError on failure."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def serve(dashboard: Dashboard, sock: socket.socket) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM end it cleanly)."""
    import uvicorn

    config = uvicorn.Config(build_app(dashboard), log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
