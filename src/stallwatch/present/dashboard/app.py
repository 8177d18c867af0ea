"""The dashboard's ASGI app (Starlette): one static page and the JSON API under /api that it uses, plus the
live event stream. Handlers ask the run's `RunAnalysis` and hand its answers to `documents`; slow questions run
on worker threads, never on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from stallwatch.log import logger
from stallwatch.present.dashboard import controls, documents
from stallwatch.present.dashboard.feed import Hub
from stallwatch.present.dashboard.security import Guard, Policy
from stallwatch.present.dashboard.served import NotServed, RunState, ServedRuns, row_id

STATIC = Path(__file__).with_name("static")
HEARTBEAT_S = 15.0
MAX_POINTS = 4000


class BadRequest(ValueError):
    pass


def create_app(served: ServedRuns, policy: Policy, *, poll_s: Callable[[Any], float] | None = None) -> Any:
    """The app serving `served` behind `policy` (host, token and origin checks)."""
    def summary_of(state: RunState) -> dict[str, Any]:
        a = state.analysis()
        live = state.live()  # before the run's lock: it may read the live files
        with state.lock:
            doc = documents.summary_doc(state.id, a, live)
        doc["version"] = state.version
        return doc

    def summary_event(state: RunState) -> bytes:
        """The summary as the live stream sends it: the same one computation the pollers share."""
        data = _shared(state, ("summary-event",), True, lambda: summary_of(state), encode=lambda d: _event("summary", d))
        return data

    hub = Hub(poll_s, summary=summary_event, encode=_event, on_steps=_note_steps)

    def api(handler: Callable[..., Any], shared: str | None = None) -> Callable[[Request], Any]:
        """`shared`: "stored" (the answer changes with the run's stored data) or "live" (with its live counts too):
        answered once per change for every client (`answers`), and sent as the bytes kept."""
        async def endpoint(request: Request) -> Response:
            try:
                if "id" in request.path_params:
                    state = served.state(request.path_params["id"])
                    body = None
                    if request.method == "POST":
                        body = await _body(request)
                    if shared is not None and body is None:
                        question = (request.url.path, tuple(sorted(request.query_params.multi_items())))
                        data = await asyncio.to_thread(_shared, state, question, shared == "live",
                                                       lambda: handler(state, request.query_params))
                        return _raw(data)
                    doc = await asyncio.to_thread(handler, state, request.query_params, body) if body is not None \
                        else await asyncio.to_thread(handler, state, request.query_params)
                else:
                    doc = await asyncio.to_thread(handler, request.query_params)
            except NotServed:
                return _json({"error": "no such run here"}, 404)
            except NoSuchThing as exc:
                return _json({"error": str(exc)}, 404)
            except TooLarge as exc:
                return _json({"error": str(exc)}, 413)
            except (BadRequest, controls.ControlError) as exc:
                return _json({"error": str(exc)}, 400)
            except Exception as exc:  # one question failing is one error answer, never the server
                logger.warning("dashboard: %s failed (%s: %s)", request.url.path, type(exc).__name__, exc)
                return _json({"error": f"{type(exc).__name__}: {exc}"}, 500)
            return doc if isinstance(doc, Response) else _json(doc)
        return endpoint

    def runs(q: Any) -> dict[str, Any]:
        rows = served.rows()
        doc = documents.runs_doc(served.root, rows)
        for row, out in zip(rows, doc["runs"]):
            out["id"] = row_id(row, served)
            out["run_id"] = row.run_id
        doc["single"] = served.single
        return doc

    def summary(state: RunState, q: Any) -> dict[str, Any]:
        return summary_of(state)

    def document(state: RunState, q: Any) -> dict[str, Any]:
        """The whole run document, as `stallwatch summary --json` prints it: from every sample, as the report."""
        from stallwatch.analyze.analysis import RunAnalysis

        a = state.analysis()
        with state.lock:
            rules = a.rule_results
        return documents.full_doc(state.id, RunAnalysis(state.run, rule_results=rules))

    def compare(state: RunState, q: Any) -> dict[str, Any]:
        """This run against `?baseline=<run>`, as `stallwatch compare BASELINE RUN` says it."""
        other = q.get("baseline")
        if not other:
            raise BadRequest("say which run to compare with: ?baseline=<run>")
        try:
            base = served.state(other)
        except NotServed:
            raise NoSuchThing(f"no run {other!r} here to compare with") from None
        first, second = sorted((state, base), key=lambda s: s.id)  # one lock order: A-B and B-A never deadlock
        with first.lock, second.lock:
            comparison = state.analysis().compare_to(base.analysis())
        return documents.compare_doc(base.id, state.id, comparison)

    def catalogue(q: Any) -> dict[str, Any]:
        """Every phase's and metric's label, unit and colour, the palettes and the units' formatting rules."""
        from stallwatch import catalogue as cat

        return {**documents.header("catalogue"), **cat.to_json()}

    def findings(state: RunState, q: Any) -> dict[str, Any]:
        return state.findings.answer(state)

    def usage(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        per_node = {}
        for node in a.nodes:
            with state.node_lock(node):
                per_node[node] = a.usage(node)
        with state.lock:
            return documents.usage_doc(a, per_node)

    def operators(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        with state.lock:
            return documents.operators_doc(a)

    def functions(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        with state.lock:
            return documents.functions_doc(a.python_functions)

    def timeline(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        node = _node(a, q)
        frm, to = _time(q, "from"), _time(q, "to")
        points = min(max(_int(q, "points", 600), 10), MAX_POINTS)
        with state.node_lock(node):
            ns = a.node_series(node, frm, to, points)
            last = a.last_sample_us(node)
        return documents.timeline_doc(ns, a.node_record(node), last)

    def events(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        node = _node(a, q)
        return documents.events_doc(node, a.events_window(node, _time(q, "from"), _time(q, "to")))

    def tracks(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        node = _node(a, q)
        buckets = min(max(_int(q, "buckets", 240), 10), 1000)
        return documents.tracks_doc(a.rank_tracks(node, _time(q, "from"), _time(q, "to"), buckets))

    def memory(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        node = _node(a, q)
        return documents.memory_doc(node, a.memory_window(node, _time(q, "from"), _time(q, "to")))

    def stacks(state: RunState, q: Any) -> dict[str, Any]:
        return documents.stacks_doc(state.analysis().latest_stacks())

    def steps(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        node = _node(a, q)
        with state.lock:
            return documents.steps_doc(node, a.recent_steps(node, min(max(_int(q, "last", 30), 1), 200)))

    def ranks(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        mode = q.get("mode", "TRAIN")
        if mode not in ("TRAIN", "EVAL", "GLOBAL"):
            raise BadRequest("mode must be TRAIN, EVAL or GLOBAL")
        with state.lock:
            return documents.ranks_doc(a, mode)

    def heatmap(state: RunState, q: Any) -> dict[str, Any]:
        a = state.analysis()
        node = _node(a, q)
        with state.node_lock(node):
            rows = a.heatmaps(node_names=[node]).get(node)
        return documents.heatmap_doc(node, rows)

    def profiling(state: RunState, q: Any, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if body is not None and "interval_ms" in body:
            ms = controls.sample_interval(body["interval_ms"])
            controls.apply_interval(state.run.location, ms)
            state.requests.append({"layer": "interval", "range": f"{ms} ms", "interval_ms": ms,
                                   "requested_us": int(time.time() * 1e6)})
            del state.requests[:-20]
        elif body is not None:
            layer = str(body.get("layer", ""))
            if layer not in controls.LAYERS:
                raise BadRequest(f"layer must be one of {', '.join(controls.LAYERS)}")
            if body.get("clear"):
                controls.apply(state.run.location, layer, None)
            else:
                live = state.live()
                latest, rate = _latest_step(state, live)
                rng = controls.profiling_range(layer, body, latest, steps_per_s=rate)
                controls.apply(state.run.location, layer, rng)
                state.requests.append({"layer": layer, "range": rng.to_spec(), "requested_us": int(time.time() * 1e6),
                                       "step_then": latest})
                del state.requests[:-20]
        config = controls.current_config(state.run.location)
        windows = state.run.profiles()
        nodes = state.run.node_records() if state.requests else {}
        live = state.live() if state.requests else None
        return documents.profiling_doc(config, [controls.interval_status(r, nodes) if r["layer"] == "interval"
                                                else controls.request_status(r, windows, live, nodes)
                                                for r in state.requests], windows)

    def capture_file(state: RunState, q: Any) -> Response:
        """A capture's stored file, as a download: only the files of the run's own complete windows."""
        node, window, name = q.get("node") or "", q.get("window") or "", q.get("file") or ""
        missing = [p for p in ("node", "rank", "window", "file") if not q.get(p)]
        if missing:
            raise BadRequest(f"a capture's file needs {', '.join(missing)} (as in the profiling answer's files)")
        rank = _int(q, "rank", -1)
        if not any(w.get("node") == node and w.get("rank") == rank and w.get("window") == window
                   for w in state.run.profiles()):
            raise NoSuchThing(f"this run has no capture {window!r} of node {node!r} rank {rank}")
        try:
            fh = state.run.open_capture(node, rank, window, name)
        except (FileNotFoundError, OSError):
            raise NoSuchThing(f"capture {window!r} of node {node!r} rank {rank} has no file {name!r}") from None

        def blocks() -> Any:
            with fh:
                while chunk := fh.read(1 << 20):
                    yield chunk

        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{node}-{rank}-{window}-{name}")
        return StreamingResponse(blocks(), media_type="application/octet-stream", headers={
            "content-disposition": f'attachment; filename="{safe}"', "cache-control": "no-store",
            "x-content-type-options": "nosniff", "content-security-policy": "sandbox"})

    def report(state: RunState, q: Any) -> Response:
        from stallwatch.analyze.analysis import RunAnalysis
        from stallwatch.present.report import render_report

        a = state.analysis()
        with state.report_lock:
            if state.report is None or state.report[0] != state.version:
                with state.lock:
                    rules = a.rule_results
                # the report states exact percentiles: its own analysis from every sample, not the rollups
                exact = RunAnalysis(state.run, rule_results=rules)
                state.report = (state.version, render_report(exact).encode("utf-8"))
            data = state.report[1]
        return Response(data, media_type="text/html; charset=utf-8", headers={
            "content-disposition": f'attachment; filename="{state.id}-report.html"', "cache-control": "no-store"})

    async def live(request: Request) -> Response:
        try:
            state = served.state(request.path_params["id"])
        except NotServed:
            return _json({"error": "no such run here"}, 404)
        client = hub.subscribe(state.id, state)

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield _event("hello", {"now_us": int(time.time() * 1e6), "readers": hub.readers,
                                       "clients": hub.clients(state.id)})
                while True:
                    try:
                        message = await asyncio.wait_for(client.queue.get(), HEARTBEAT_S)
                    except asyncio.TimeoutError:
                        yield b": heartbeat\n\n"
                        continue
                    yield message["bytes"]  # encoded once for every client
            finally:
                hub.unsubscribe(state.id, client)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    def health(q: Any) -> dict[str, Any]:
        return {"ok": True, "readers": hub.readers, "readers_started": hub.readers_started}

    def metrics(q: Any) -> Response:
        """Prometheus: the served runs that are still running (a finished run's numbers no longer change)."""
        from prometheus_client import CONTENT_TYPE_LATEST

        from stallwatch.present.dashboard.metrics import exposition

        live = []
        for row in served.rows():
            if row.status == "running":
                state = served.state(row_id(row, served))
                live.append((state.id, state.analysis()))
        return Response(exposition(live), media_type=CONTENT_TYPE_LATEST)

    async def shared_js(request: Request) -> Response:
        """draw.js (present/static, the report's renderer) and BokehJS's two files from the installed bokeh
        package (located, never imported): the dashboard draws with the report's code. Named files only."""
        from stallwatch.present import drawpage

        name = request.path_params["name"]
        if name in drawpage.BOKEH_FILES:
            path = drawpage.bokeh_js_dir() / name
        elif name == "draw.js":
            path = drawpage.STATIC / name
        else:
            return _json({"error": "no such file"}, 404)
        return FileResponse(path, media_type="text/javascript", headers={"cache-control": "no-cache"})

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})

    routes = [
        Route("/", index),
        Route("/api/health", api(health)),
        Route("/metrics", api(metrics)),
        Route("/api/runs", api(runs)),
        Route("/api/catalogue", api(catalogue)),
        Route("/api/run/{id}/summary", api(summary, "live")),
        Route("/api/run/{id}/document", api(document, "stored")),
        Route("/api/run/{id}/findings", api(findings)),
        Route("/api/run/{id}/usage", api(usage, "stored")),
        Route("/api/run/{id}/operators", api(operators, "stored")),
        Route("/api/run/{id}/functions", api(functions, "stored")),
        Route("/api/run/{id}/timeline", api(timeline, "stored")),
        Route("/api/run/{id}/events", api(events, "stored")),
        Route("/api/run/{id}/steps", api(steps, "stored")),
        Route("/api/run/{id}/tracks", api(tracks, "stored")),
        Route("/api/run/{id}/memory", api(memory, "stored")),
        Route("/api/run/{id}/stacks", api(stacks, "stored")),
        Route("/api/run/{id}/ranks", api(ranks, "stored")),
        Route("/api/run/{id}/heatmap", api(heatmap, "stored")),
        Route("/api/run/{id}/profiling", api(profiling), methods=["GET", "POST"]),
        Route("/api/run/{id}/compare", api(compare)),
        Route("/api/run/{id}/report", api(report)),
        Route("/api/run/{id}/capture", api(capture_file)),
        Route("/api/run/{id}/live", live),
        Route("/draw/{name}", shared_js),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await hub.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.hub = hub
    return Guard(app, policy)


MAX_BODY_BYTES = 64 * 1024  # a control's request is a few hundred bytes; anything larger is refused unread


class NoSuchThing(Exception):
    """A run that exists but lacks what was asked for: 404 with what is missing (not "no such run")."""


class TooLarge(Exception):
    """A request body over MAX_BODY_BYTES: answered 413 before it is held in memory."""


async def _body(request: Request) -> dict[str, Any]:
    """A POST's JSON object, read at most MAX_BODY_BYTES into memory, nested at most a few levels deep."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise TooLarge(f"the request body is {int(declared)} bytes; at most {MAX_BODY_BYTES} are accepted")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise TooLarge(f"the request body is over {MAX_BODY_BYTES} bytes, the most accepted")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        raise BadRequest("the request body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _shared(state: RunState, question: Any, live: bool, compute: Callable[[], Any],
            encode: Callable[[Any], bytes] | None = None) -> bytes:
    """The answer's bytes, computed once per stamp of the run for every client asking."""
    encode = encode or (lambda doc: _dumps(doc))
    return state.answers.get(question, state.stamp(live), lambda: encode(compute()))


def _note_steps(state: RunState, data: dict[str, Any]) -> None:
    recent = data.get("recent") or []
    steps = [s.get("step") for s in recent if s.get("mode") == "TRAIN" and isinstance(s.get("step"), int)]
    if steps:
        state.latest_step = max(steps + ([state.latest_step] if state.latest_step is not None else []))


def _latest_step(state: RunState, live: Any) -> tuple[int | None, float | None]:
    """The job's newest training step as it stands now (its live counts; else what the store has) and its rate."""
    candidates = [x for x in (live.latest_step if live is not None else None, state.latest_step) if x is not None]
    if candidates:
        return max(candidates), live.steps_per_s if live is not None else None
    a = state.analysis()
    with state.lock:
        return a.latest_step, None


def _node(a: Any, q: Any) -> str:
    node = q.get("node") or (a.nodes[0] if a.nodes else "")
    if node not in a.nodes:
        raise BadRequest("no such node in this run")
    return node


def _int(q: Any, name: str, default: int) -> int:
    text = q.get(name)
    if text in (None, ""):
        return default
    try:
        return int(text)
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None


def _time(q: Any, name: str) -> int | None:
    text = q.get(name)
    if text in (None, ""):
        return None
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name} must be µs since the Unix epoch (an integer)") from None
    if not 0 <= value < 2**62:
        raise BadRequest(f"{name} is out of range")
    return value


def _dumps(doc: Any) -> bytes:
    return json.dumps(_plain(doc), allow_nan=False, separators=(",", ":")).encode()


def _json(doc: Any, status: int = 200) -> Response:
    return _raw(_dumps(doc), status)


def _raw(data: bytes, status: int = 200) -> Response:
    return Response(data, status, media_type="application/json", headers={"cache-control": "no-store"})


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(_plain(data), allow_nan=False, separators=(',', ':'))}\n\n".encode()


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
