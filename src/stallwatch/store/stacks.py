"""stacks/<node>/<rank>/<request>-<pid>.json: the Python stacks of every thread of one process of a rank, as it
sent them when asked (`dump_stacks` raised in config.json; the Hang rule asks when a rank stops). Written by the
sampler, read back as untrusted data: every field checked, sizes bounded, anything else skipped (said once)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from stallwatch.log import warn_once
from stallwatch.store import layout

STACKS_DIR = "stacks"
MAX_FILE_BYTES = 1 << 20
MAX_DUMPS_READ = 512  # the newest are kept: a run asked for stacks a few times, not thousands
MAX_THREADS = 256
MAX_FRAMES = 256
MAX_TEXT = 1000


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str = ""


@dataclass(frozen=True)
class ThreadStack:
    name: str
    main: bool
    daemon: bool | None
    frames: list[Frame]  # outermost first
    frames_left_out: int = 0


@dataclass(frozen=True)
class StackDump:
    """One process's threads at one moment: the answer of node/rank/pid to request `request`."""

    node: str
    rank: int
    pid: int
    request: int
    at_us: int
    threads: list[ThreadStack] = field(default_factory=list)  # the main thread first
    threads_left_out: int = 0
    path: str = ""

    @property
    def main(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Any) -> StackDump:
        """Checked field by field (a run is untrusted input); raises ValueError naming what is wrong."""
        if not isinstance(d, dict):
            raise ValueError("a stack dump is a JSON object")
        threads = d.get("threads")
        if not isinstance(threads, list):
            raise ValueError("threads must be a list")
        return StackDump(_text(d.get("node"), "node"), _int(d.get("rank"), "rank"), _int(d.get("pid"), "pid"),
                         _int(d.get("request"), "request"), _int(d.get("at_us"), "at_us"),
                         [_thread(t) for t in threads[:MAX_THREADS]],
                         _int(d.get("threads_left_out", 0), "threads_left_out") + max(0, len(threads) - MAX_THREADS),
                         str(d.get("path") or "")[:MAX_TEXT])


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"{name} must be an integer")
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be text")
    return value[:MAX_TEXT]


def _thread(t: Any) -> ThreadStack:
    if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
        raise ValueError("a thread is an object with a list of frames")
    frames = t["frames"]
    kept = frames[-MAX_FRAMES:]  # the innermost
    daemon = t.get("daemon")
    return ThreadStack(_text(t.get("name", ""), "thread name"), t.get("main") is True,
                       daemon if isinstance(daemon, bool) else None,
                       [Frame(_text(f.get("file"), "file"), _int(f.get("line") or 0, "line"),
                              _text(f.get("function"), "function"), _text(f.get("code") or "", "code"))
                        for f in kept if isinstance(f, dict)],
                       _int(t.get("frames_left_out", 0), "frames_left_out") + len(frames) - len(kept))


def dump_path(node: str, rank: int, request: int, pid: int) -> str:
    return f"{STACKS_DIR}/{node}/{int(rank)}/{int(request):06d}-{int(pid)}.json"


def write_dump(sink: Any, node: str, identity: dict[str, int], dump: dict[str, Any]) -> str:
    """Store what a process sent (checked first: a malformed dump raises ValueError and nothing is written)."""
    record = StackDump.from_json({**dump, "node": node, "rank": identity["rank"], "pid": identity["pid"]})
    rel = dump_path(node, record.rank, record.request, record.pid)
    data = {k: v for k, v in record.to_json().items() if k != "path"}
    sink.write_atomic(rel, json.dumps(data, separators=(",", ":")).encode())
    return rel


def read_dumps(location: Any) -> list[StackDump]:
    """Every stack dump of the run (newest MAX_DUMPS_READ), oldest first; unreadable ones skipped (said once)."""
    entries = [e for e in location.list(STACKS_DIR) if e.path.endswith(".json")]
    entries.sort(key=lambda e: e.path)
    out = []
    for entry in entries[-MAX_DUMPS_READ:]:
        parts = entry.path.split("/")
        if len(parts) != 4 or not layout.readable_node(parts[1]) or layout.rank_number(parts[2]) is None:
            continue
        if entry.size > MAX_FILE_BYTES:
            warn_once(f"stacks-big-{entry.path}", "skipping %s: larger than %d bytes", entry.path, MAX_FILE_BYTES)
            continue
        try:
            record = StackDump.from_json({**json.loads(location.read(entry.path)), "path": entry.path})
        except (OSError, ValueError, TypeError, RecursionError) as exc:
            warn_once(f"stacks-{entry.path}", "skipping %s: %s", entry.path, exc)
            continue
        if record.node != parts[1] or str(record.rank) != parts[2]:
            warn_once(f"stacks-where-{entry.path}", "skipping %s: it names another node or rank", entry.path)
            continue
        out.append(record)
    return sorted(out, key=lambda d: (d.at_us, d.node, d.rank, d.pid))


def dumps_of(run: Any) -> list[StackDump]:
    """The stack dumps of an open run (store.reader.Run); none when its location cannot be listed (said once)."""
    location = getattr(run, "location", None)
    if location is None:
        return []
    try:
        return read_dumps(location)
    except OSError as exc:
        warn_once("stacks-list", "cannot list the run's stacks (%s)", exc)
        return []
