"""Live updates: ONE reader per run, however many tabs watch it. While at least one client listens, the
reader polls the store for what is new (snapshots, step events, node status) on a worker thread and pushes the
delta to every client's bounded queue; a slow client loses its oldest messages and is told to resync, never
slowing the others or the reader. The reader stops when its last client goes."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio.to_thread
import numpy as np

from stallwatch.analyze.frames import NodeFrame
from stallwatch.analyze.node_series import LIVE_SERIES, METRICS, named_columns, tidy_frame
from stallwatch.analyze.judge.live import LiveFeed
from stallwatch.analyze.step_window import EVENT_KINDS, step_breakdown
from stallwatch.log import logger
from stallwatch.records import STEP
from stallwatch.store.live_status import live_version, read_live

POLL_LOCAL_S = 0.5
POLL_REMOTE_S = 2.0
QUEUE_MAX = 64  # messages a client may lag behind before its oldest are dropped
MAX_ROWS = 2000  # snapshots per node in one message (a reader that fell far behind sends the newest)


@dataclass(eq=False)
class Client:
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=lambda: asyncio.Queue(QUEUE_MAX))
    dropped: int = 0

    def put(self, message: dict[str, Any]) -> None:
        """`message`: {"event": name, "bytes": the encoded event}, the same object for every client."""
        try:
            self.queue.put_nowait(message)
        except asyncio.QueueFull:
            try:
                self.queue.get_nowait()
            except asyncio.QueueEmpty:
                pass
            self.dropped += 1
            self.queue.put_nowait({"event": "resync", "bytes": _encode("resync", {"dropped": self.dropped})})


def _encode(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class RunReader:
    """Follows one run for its clients: `poll()` (on a worker thread) returns the messages new data makes."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.tail = run.tail_system(metrics=METRICS).skip_to_end()
        self.events = LiveFeed(run).skip_existing()
        self.statuses: dict[str, Any] = {}
        self.polls = 0
        self.pushed: dict[str, int] = {}  # per node: the newest snapshot sent from the live counts
        self._live_stamp: Any = None

    def poll(self) -> list[dict[str, Any]]:
        self.polls += 1
        out: list[dict[str, Any]] = []
        now = int(time.time() * 1e6)
        rows = self.tail.read()
        records = self.run.node_records()
        nodes = {n: r.to_json() for n, r in records.items()}  # the frames' view of a record
        if rows.num_rows:
            for node in sorted(set(rows["node"].cast("string").to_pylist())):
                out.append({"event": "samples", "data": _samples(node, rows, nodes.get(node), now)})
        out += self._live_samples(sorted(records), nodes, now)
        statuses = {n: (r.status, r.exit_code) for n, r in records.items()}
        if statuses != self.statuses:
            self.statuses = statuses
            out.append({"event": "status", "data": {"nodes": {n: {"status": s, "exit_code": c}
                                                              for n, (s, c) in statuses.items()}}})
        events = self.events.new_events()
        if events.num_rows:
            kinds = np.asarray(events["kind"].cast("string").to_pylist(), dtype=object)
            modes = np.asarray(events["mode"].cast("string").to_pylist(), dtype=object)
            is_step = kinds == STEP
            counts = {str(m): int((modes[is_step] == m).sum()) for m in set(modes[is_step].tolist())}
            mine = events.filter(np.isin(kinds, EVENT_KINDS))
            steps = [_plain(s.__dict__) for s in step_breakdown(mine, 30)]
            out.append({"event": "steps", "data": {"new": counts, "recent": steps, "now_us": now}})
        if out:
            out.append({"event": "changed", "data": {"now_us": now}})
        return out


    def _live_samples(self, names: list[str], nodes: dict[str, Any], now: int) -> list[dict[str, Any]]:
        """The newest snapshots from the nodes' live counts (ahead of the next flush), each sent once."""
        stamp = live_version(self.run.location, names)
        if stamp is not None and stamp == self._live_stamp:
            return []
        self._live_stamp = stamp
        out = []
        for name, live in read_live(self.run.location, names).items():
            rows = [row for row in live.snapshots if row[0] > self.pushed.get(name, 0)]
            if not rows or not live.columns:
                continue
            self.pushed[name] = rows[-1][0]
            values = np.array([[np.nan if v is None else v for v in vs] for _, vs in rows], np.float32)
            frame = NodeFrame(name, np.array([t for t, _ in rows], np.int64),
                              {c: values[:, i] for i, c in enumerate(live.columns)}, nodes.get(name) or {})
            cols = named_columns(frame)
            out.append({"event": "samples", "data": {
                "node": name, "ts": frame.timestamps.tolist(), "now_us": now, "live": True,
                "series": {k: _round(cols[k]) for k in LIVE_SERIES if k in cols}}})
        return out


def _samples(node: str, rows: Any, record: Any, now_us: int) -> dict[str, Any]:
    frame = tidy_frame(node, rows, record if isinstance(record, dict) else {})
    cols = named_columns(frame)
    ts = frame.timestamps[-MAX_ROWS:]
    series = {k: _round(cols[k][-MAX_ROWS:]) for k in LIVE_SERIES if k in cols}
    return {"node": node, "ts": ts.tolist(), "series": series, "now_us": now_us}


def _round(values: np.ndarray) -> list[float | None]:
    v = np.round(values.astype(np.float64), 2)
    return [None if x != x else x for x in v.tolist()]


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, np.floating) else v) for k, v in d.items()}


class Hub:
    """The readers of the served runs, one per run with listeners. Each message is encoded once and the same
    bytes handed to every client; with `summary`, the run's summary (kept by the server for its pollers too) is
    sent whenever the job's live counts or its stored data changed."""

    def __init__(self, poll_s: Callable[[Any], float] | None = None, *,
                 summary: Callable[[Any], bytes] | None = None,
                 encode: Callable[[str, Any], bytes] | None = None,
                 on_steps: Callable[[Any, dict[str, Any]], None] | None = None) -> None:
        self._clients: dict[str, set[Client]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._poll_s = poll_s
        self._summary = summary
        self._encode = encode or _encode
        self._on_steps = on_steps
        self.readers_started = 0

    def clients(self, run_id: str) -> int:
        return len(self._clients.get(run_id, ()))

    @property
    def readers(self) -> int:
        return sum(1 for t in self._tasks.values() if not t.done())

    def subscribe(self, run_id: str, state: Any) -> Client:
        client = Client()
        self._clients.setdefault(run_id, set()).add(client)
        task = self._tasks.get(run_id)
        if task is None or task.done():
            self.readers_started += 1
            self._tasks[run_id] = asyncio.get_running_loop().create_task(self._follow(run_id, state))
        return client

    def unsubscribe(self, run_id: str, client: Client) -> None:
        clients = self._clients.get(run_id)
        if clients is not None:
            clients.discard(client)
            if not clients:
                self._clients.pop(run_id, None)
                task = self._tasks.pop(run_id, None)
                if task is not None:
                    task.cancel()

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        self._tasks.clear()

    async def _follow(self, run_id: str, state: Any) -> None:
        reader: RunReader | None = None
        interval = POLL_REMOTE_S if state.run.location.remote else POLL_LOCAL_S
        if self._poll_s is not None:
            interval = self._poll_s(state)
        failures = 0
        last_summary: bytes | None = None
        while self._clients.get(run_id):
            try:
                if reader is None:
                    reader = await anyio.to_thread.run_sync(RunReader, state.run)
                messages = await anyio.to_thread.run_sync(reader.poll)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store hiccuped: say so once, keep following
                failures += 1
                if failures == 1:
                    logger.warning("dashboard: reading %s failed (%s: %s); retrying", run_id, type(exc).__name__, exc)
                messages = []
            if any(m["event"] == "changed" for m in messages):
                state.changed()
            for m in messages:
                if m["event"] == "steps" and self._on_steps is not None:
                    self._on_steps(state, m["data"])
            out = [{"event": m["event"], "bytes": self._encode(m["event"], m["data"])} for m in messages]
            if self._summary is not None:
                try:
                    summary = await anyio.to_thread.run_sync(self._summary, state)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    summary = None
                    if failures == 0:
                        logger.warning("dashboard: the summary of %s failed (%s: %s)", run_id, type(exc).__name__, exc)
                if summary is not None and summary is not last_summary:  # kept bytes: new only when they changed
                    last_summary = summary
                    out.insert(0, {"event": "summary", "bytes": summary})
            for message in out:
                for client in list(self._clients.get(run_id, ())):
                    client.put(message)
            await asyncio.sleep(interval * (1 if failures == 0 else min(2 ** failures, 30)))
