"""A node that comes back: `stallwatch run --node NAME` into a run that already has NAME (a Slurm requeue, a
restarted pod) resumes it as a new attempt under the same run instead of refusing to start the job.

The attempt is claimed with an exclusive create of `nodes/<node>.attempt-<N>` (so two requeues at once cannot
both take it), and the node record keeps the earlier attempts (`attempts`). An earlier attempt that still
looks alive (its sampler running on this machine, or data written moments ago from another one) is not joined:
the job runs under a name no other machine takes, said so, as when a claim goes unanswered."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stallwatch.store import layout
from stallwatch.store.location import RunLocation

LIVE_WITHIN_S = 60.0  # an unfinished attempt on another machine that wrote data this recently may be running
_ATTEMPT_FIELDS = ("attempt", "start_us", "end_us", "exit_code", "exit_signal", "hostname", "status")
MAX_ATTEMPTS_KEPT = 100  # the node record keeps the most recent earlier attempts; `attempt` still counts all
MAX_ATTEMPT = 1_000_000  # a number read from the run is data: bounded


@dataclass(frozen=True)
class Resumed:
    """How this machine joins a node it found in the run."""

    attempt: int  # this attempt's number (the first run of a node is attempt 1)
    earlier: list[dict[str, Any]]  # the earlier attempts, oldest first (what their records said)
    first_start_us: int | None  # when the node's first attempt started: the node's span covers every attempt


def attempt_claim(node: str, attempt: int) -> str:
    """The file whose exclusive creation claims attempt `attempt` of `node` (not a `.json`: no reader takes it
    for a node)."""
    return f"{layout.NODES_DIR}/{node}.attempt-{attempt}"


def earlier_record(location: RunLocation, node: str) -> dict[str, Any] | None:
    """The node's record as the run holds it (untrusted data), or None when it cannot be read."""
    try:
        value = json.loads(location.read(layout.node_json(node), max_bytes=1 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def still_running(location: RunLocation, node: str, record: dict[str, Any], *,
                  now_s: Callable[[], float] = time.time) -> str | None:
    """Why the attempt `record` describes may still be running (so joining it would mix two samplers' data), or
    None when it has ended: it recorded its end, or its sampler is gone from this machine, or (from another
    machine) it has written nothing for `LIVE_WITHIN_S`."""
    if _int(record.get("end_us")) is not None:
        return None
    if record.get("hostname") == socket.gethostname():
        pid = _int(record.get("sampler_pid"))
        if pid is not None and _is_sampler(pid):
            return f"its sampler (pid {pid}) is running on this machine"
        return None
    newest = max((c.end_us for c in (layout.parse_chunk(e.path) for e in location.list(layout.system_dir(node)))
                  if c is not None), default=None)
    if newest is not None and now_s() - newest / 1e6 < LIVE_WITHIN_S:
        return f"it wrote data {max(0.0, now_s() - newest / 1e6):.0f} s ago from {record.get('hostname')!s:.100}"
    return None


def resume_plan(record: dict[str, Any]) -> Resumed:
    """The next attempt after the one `record` describes, carrying the earlier attempts along."""
    earlier = [a for a in record.get("attempts", []) if isinstance(a, dict)] if isinstance(
        record.get("attempts"), list) else []
    this = {k: record.get(k) for k in _ATTEMPT_FIELDS}
    previous = min(_int(record.get("attempt")) or 1, MAX_ATTEMPT)
    this["attempt"] = previous
    earlier = [_plain(a) for a in earlier if _int(a.get("attempt"))][-(MAX_ATTEMPTS_KEPT - 1):] + [_plain(this)]
    starts = [s for s in (_int(a.get("start_us")) for a in earlier) if s is not None]
    return Resumed(attempt=previous + 1, earlier=earlier, first_start_us=min(starts) if starts else None)


def _plain(attempt: dict[str, Any]) -> dict[str, Any]:
    """An attempt's fields as the run's schema has them (values of another type, read from the run, are None)."""
    out: dict[str, Any] = {}
    for key in _ATTEMPT_FIELDS:
        value = attempt.get(key)
        if key in ("hostname", "status"):
            out[key] = value if isinstance(value, str) and len(value) <= 256 else None
        elif key == "exit_signal":  # as the launcher writes it: "SIGTERM"
            out[key] = value if isinstance(value, str) and value.startswith("SIG") and value[3:].isalnum() \
                and len(value) <= 16 else None
        elif key == "exit_code":
            out[key] = value if isinstance(value, int) and not isinstance(value, bool) and -2**31 <= value < 2**31 \
                else None
        else:
            out[key] = _int(value)
    out["attempt"] = min(out["attempt"] or 1, MAX_ATTEMPT)
    return out


def _is_sampler(pid: int) -> bool:
    try:
        import psutil

        return "stallwatch.collect.sampler_process" in " ".join(psutil.Process(pid).cmdline())
    except Exception:  # gone, or not ours to look at
        return False


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63 else None
