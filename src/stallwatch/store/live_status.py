"""A node's live counts (`live/<node>.json`, docs/format.md): what its sampler has received from the job so far —
steps per rank and mode, the newest step, the loop's span, phase time, a coarse progress curve and what became of
live profiling requests — rewritten every second while the job runs. Stored events trail the job by a flush
interval; these counts trail it by the sampler's write period, so the live dashboard reads them for its numbers.
The file is untrusted input like every file of a run: each field is checked and a bad one left out."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from stallwatch.log import warn_once
from stallwatch.records import MODES
from stallwatch.store import layout

SCHEMA = 1
MAX_BYTES = 1 << 20  # a few KB in practice; a larger file is not a sampler's
MAX_PROGRESS = 512  # points of the progress curve a sampler keeps (thinned evenly when full)
MAX_NOTICES = 32  # the newest profiling notices a sampler keeps
MAX_SNAPSHOTS = 24  # the newest system snapshots a sampler keeps (more than a flush interval's at 500 ms)
MAX_COLUMNS = 512


@dataclass(frozen=True)
class LiveRank:
    rank: int
    pid: int | None
    steps: dict[str, int]  # per mode: steps done (timed and counted)
    last_step: dict[str, int]  # per mode: the newest step number
    first_us: int | None  # the first step's start
    last_us: int | None  # the newest step's end


@dataclass(frozen=True)
class Notice:
    """What the job did with a profiling window it was given: started, captured, or why not."""
    rank: int
    layer: str
    range: str  # the window as `ProfilingRange.to_spec()` writes it
    outcome: str  # started | captured | past | ran_already | failed
    message: str
    at_us: int


@dataclass(frozen=True)
class LiveNode:
    node: str
    written_us: int
    running: bool
    ranks: tuple[LiveRank, ...]
    progress: tuple[tuple[int, int], ...]  # (time µs, steps done on this node, all ranks and modes)
    step_us: dict[str, int]  # per mode: the timed steps' time, together
    phase_us: dict[str, dict[str, int]]  # per mode and phase: its time, together
    notices: tuple[Notice, ...] = field(default_factory=tuple)
    columns: tuple[str, ...] = ()  # of the newest snapshots: `device/metric`, node-wide series only
    snapshots: tuple[tuple[int, tuple[float | None, ...]], ...] = ()  # (time µs, a value per column), in time order

    @property
    def steps(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.ranks:
            for mode, n in r.steps.items():
                out[mode] = out.get(mode, 0) + n
        return out


def write_live(sink: Any, node: str, document: dict[str, Any]) -> None:
    """The sampler's counts (`collect.live_counts`), replacing the previous ones."""
    sink.write_atomic(layout.live_json(node), json.dumps({"schema": SCHEMA, **document},
                                                         separators=(",", ":")).encode())


def live_version(location: Any, nodes: list[str]) -> tuple[Any, ...] | None:
    """What changes when any node's live file is rewritten, read without opening them (None: unknown, remote)."""
    stamps = []
    for node in nodes:
        v = location.version(layout.live_json(node))
        if v is None:
            return None
        stamps.append(v)
    return tuple(stamps)


def read_live(location: Any, nodes: list[str]) -> dict[str, LiveNode]:
    """The live counts of those `nodes` that have them (a node without, or with an unreadable file, is left out)."""
    out = {}
    for node in nodes:
        rel = layout.live_json(node)
        try:
            data = json.loads(location.read(rel, MAX_BYTES))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, RecursionError) as exc:
            warn_once(f"live-json-{location.uri}-{node}", "skipping %s (%s)", rel, str(exc)[:200])
            continue
        parsed = _parse(node, data)
        if parsed is not None:
            out[node] = parsed
    return out


def _parse(node: str, data: Any) -> LiveNode | None:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not _int(data.get("written_us")):
        return None
    ranks = []
    for r in _list(data.get("ranks")):
        if not isinstance(r, dict) or not _int(r.get("rank")):
            continue
        ranks.append(LiveRank(rank=r["rank"], pid=r.get("pid") if _int(r.get("pid")) else None,
                              steps=_counts(r.get("steps")), last_step=_counts(r.get("last_step")),
                              first_us=r.get("first_us") if _int(r.get("first_us")) else None,
                              last_us=r.get("last_us") if _int(r.get("last_us")) else None))
    progress = tuple((int(p[0]), int(p[1])) for p in _list(data.get("progress"))[:MAX_PROGRESS * 2]
                     if isinstance(p, list) and len(p) == 2 and _int(p[0]) and _int(p[1]))
    phases: dict[str, Any] = data["phase_us"] if isinstance(data.get("phase_us"), dict) else {}
    notices = []
    for n in _list(data.get("notices"))[:MAX_NOTICES * 2]:
        if isinstance(n, dict) and _int(n.get("rank")) and _int(n.get("at_us")) and all(
                isinstance(n.get(k), str) for k in ("layer", "range", "outcome", "message")):
            notices.append(Notice(n["rank"], n["layer"][:40], n["range"][:200], n["outcome"][:40],
                                  n["message"][:500], n["at_us"]))
    columns, snapshots = _snapshots(data.get("snapshots"))
    return LiveNode(node=node, written_us=data["written_us"], running=data.get("running") is True,
                    ranks=tuple(sorted(ranks, key=lambda r: r.rank)), progress=progress,
                    step_us=_counts(data.get("step_us")),
                    phase_us={m: _counts(v, keys=None) for m, v in phases.items() if m in MODES},
                    notices=tuple(notices), columns=columns, snapshots=snapshots)


def _snapshots(value: Any) -> tuple[tuple[str, ...], tuple[tuple[int, tuple[float | None, ...]], ...]]:
    if not isinstance(value, dict) or not isinstance(value.get("columns"), list) or \
            not isinstance(value.get("rows"), list):
        return (), ()
    columns = value["columns"][:MAX_COLUMNS]
    if not all(isinstance(c, str) and 0 < len(c) <= 200 and c.count("/") == 1 for c in columns):
        return (), ()
    rows = []
    for row in value["rows"][-MAX_SNAPSHOTS:]:
        if isinstance(row, list) and len(row) == len(columns) + 1 and _int(row[0]) and all(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in row[1:]):
            rows.append((row[0], tuple(None if v is None else float(v) for v in row[1:])))
    rows.sort(key=lambda x: x[0])
    return tuple(columns), tuple(rows)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _counts(value: Any, keys: tuple[str, ...] | None = MODES) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {str(k)[:40]: v for k, v in value.items()
            if (keys is None or k in keys) and _int(v) and v >= 0}


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
