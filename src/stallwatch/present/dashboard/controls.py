"""Profiling controls: a request from the page becomes a change of the run's live configuration, validated and
written the way `stallwatch config RUN` writes it (the job's sampler re-reads config.json and hands the change
to the job); whether the job picked it up is read back from the capture windows it wrote."""

from __future__ import annotations

import math
import time
from typing import Any

from stallwatch.config import SAMPLE_INTERVAL_PRESETS_MS, ConfigError, ProfilerConfig, ProfilingRange
from stallwatch.present.dashboard.documents import capture
from stallwatch.store import run_files
from stallwatch.store.node_record import NodeRecord

LAYERS = {"detailed": "detailed_profiling", "dataloader": "dataloader_profiling", "python": "python_profiling"}
STEP_MARGIN = 2  # steps between the newest step seen here and the first profiled one, at least
LEAD_S = 3.0  # the live step is about a second old, and the request reaches the job a second or so later
ANSWER_WITHIN_S = 60.0  # a request the job neither took nor refused by then has expired
STORE_WITHIN_S = 60.0  # a capture the job made is stored (and listed) within this long


class ControlError(ValueError):
    """A request that cannot be applied; the message says why and what is allowed."""


def current_config(location: Any) -> ProfilerConfig:
    try:
        return run_files.read_config(location)
    except FileNotFoundError:
        return ProfilerConfig()
    except (ConfigError, OSError) as exc:
        raise ControlError(f"the run's config.json cannot be changed: {exc}") from None


def profiling_range(layer: str, body: dict[str, Any], latest_step: int | None,
                    steps_per_s: float | None = None) -> ProfilingRange:
    """The window a request asks for: N steps from a start step (blank: a step still ahead of the job when the
    request reaches it — the job's live step plus what it runs in LEAD_S at its current rate), or a time range."""
    field = LAYERS.get(layer)
    if field is None:
        raise ControlError(f"unknown profiling layer {layer!r}: use one of {', '.join(LAYERS)}")
    try:
        if body.get("duration_s") not in (None, ""):
            start = body.get("start_time_us")
            start_us = int(time.time() * 1e6) if start in (None, "") else _int("start_time_us", start)
            rng = ProfilingRange(start_time_us=start_us, duration_s=float(body["duration_s"]))
        else:
            start = body.get("start_step")
            if start in (None, ""):
                start_step = 0 if latest_step is None else \
                    latest_step + STEP_MARGIN + math.ceil(max(steps_per_s or 0.0, 0.0) * LEAD_S)
            else:
                start_step = _int("start_step", start)
            rng = ProfilingRange(start_step=start_step, num_steps=_int("num_steps", body.get("num_steps") or 1))
        rng.validate(field)
    except ConfigError as exc:
        raise ControlError(str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise ControlError(f"invalid profiling request: {exc}") from None
    return rng


def apply(location: Any, layer: str, rng: ProfilingRange | None) -> tuple[ProfilerConfig, ProfilerConfig]:
    """Write the change (None clears the layer's window); (before, after)."""
    field = LAYERS[layer]
    before = current_config(location)
    try:
        after = before.replace(**{field: rng})
    except ConfigError as exc:
        raise ControlError(str(exc)) from None
    run_files.write_config(location, after)
    return before, after


def sample_interval(value: Any) -> int:
    """The interval a request asks for: one of the seed's presets (ms); anything else is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or str(value).strip() not in \
            {str(p) for p in SAMPLE_INTERVAL_PRESETS_MS}:
        raise ControlError(f"interval_ms must be one of {', '.join(str(p) for p in SAMPLE_INTERVAL_PRESETS_MS)} "
                           f"(ms), got {str(value)[:40]!r}")
    return int(str(value).strip())


def apply_interval(location: Any, interval_ms: int) -> tuple[ProfilerConfig, ProfilerConfig]:
    """Write a new sampling interval into the live configuration; (before, after)."""
    before = current_config(location)
    try:
        after = before.replace(sample_interval_ms=interval_ms)
    except ConfigError as exc:
        raise ControlError(str(exc)) from None
    run_files.write_config(location, after)
    return before, after


def interval_status(request: dict[str, Any], nodes: dict[str, NodeRecord]) -> dict[str, Any]:
    """An interval request with when each running node's sampler took it (its record's `sample_intervals`);
    picked up once every node that records intervals has."""
    taken: dict[str, int | None] = {}
    for node, record in sorted(nodes.items()):
        if not record.sample_intervals:  # a node that does not record its intervals (an older sampler)
            continue
        taken[node] = min((e.from_us for e in record.sample_intervals if e.sample_interval_ms == request["interval_ms"]
                           and e.from_us >= request["requested_us"] - 1_000_000), default=None)
    done = bool(taken) and all(v is not None for v in taken.values())
    return {**request, "picked_up_us": max(v for v in taken.values() if v is not None) if done else None,
            "nodes": [{"node": n, "picked_up_us": v} for n, v in taken.items()], "captures": []}


def request_status(request: dict[str, Any], windows: list[dict[str, Any]], live: Any = None,
                   nodes: dict[str, NodeRecord] | None = None, now_us: int | None = None) -> dict[str, Any]:
    """A request with what became of it, always heading for an end: `state` is captured (its capture windows,
    or the job's word for data-loader timing), rejected (the job's reason: past, ran already, could not start),
    ended (the job ended first), expired (no answer from the job in time), or waiting / started / storing, with
    a `message` the page shows as it is."""
    now_us = now_us if now_us is not None else int(time.time() * 1e6)
    since = request["requested_us"] - 1_000_000
    layer = "python" if request["layer"] == "python" else "detailed"
    found = [w for w in windows if w.get("layer") == layer and isinstance(w.get("start_us"), int)
             and w["start_us"] >= since]
    if request["layer"] == "dataloader":
        found = []  # data-loader timing lands in the framework events, not in a capture window
    told = [n for n in (live.notices if live is not None else ()) if n.layer == request["layer"]
            and n.range == request["range"] and n.at_us >= since]
    out = {**request, "picked_up_us": min([w["start_us"] for w in found] +
                                          [n.at_us for n in told if n.outcome == "started"], default=None),
           "captures": [capture(w) for w in found]}
    latest = live.latest_step if live is not None else None
    ended = bool(nodes) and all(r.finished for r in nodes.values())
    last = told[-1] if told else None
    waited_s = (now_us - request["requested_us"]) / 1e6
    if found:
        state, message = "captured", f"captured ({len(found)} window{'s' if len(found) > 1 else ''})"
    elif last is not None and last.outcome in ("past", "ran_already", "failed"):
        state, message = "rejected", last.message
    elif last is not None and last.outcome == "captured":
        if request["layer"] == "dataloader":
            state, message = "captured", f"{last.message} (in the framework timeline)"
        elif ended or waited_s > STORE_WITHIN_S + ANSWER_WITHIN_S:
            state, message = "expired", f"{last.message}, but no capture was stored (see the job's log)"
        else:
            state, message = "storing", f"{last.message}; storing the capture…"
    elif ended:
        state, message = "ended", "the job ended before it took this request" if last is None else \
            "the job ended during the window (its capture, if any, is listed below)"
    elif last is not None and last.outcome == "started":
        state, message = "started", last.message
    elif waited_s > ANSWER_WITHIN_S and (live is None or not live.notices or _past(request, latest)):
        state, message = "expired", (f"no answer from the job within {ANSWER_WITHIN_S:.0f} s" +
                                     (f" (it is at step {latest})" if latest is not None else
                                      ": is it running under `stallwatch run` with framework hooks?"))
    else:
        state, message = "waiting", "waiting for the job" + (f" (now at step {latest})" if latest is not None else "")
    out.update(state=state, message=message, step_now=latest)
    return out


def _past(request: dict[str, Any], latest: int | None) -> bool:
    """A step window the job's live step has gone beyond."""
    try:
        rng = ProfilingRange.parse("profiling", request["range"])
    except Exception:
        return True
    return not rng.by_steps or (latest is not None and latest >= rng.start_step + rng.num_steps)


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ControlError(f"{name} must be an integer")
    try:
        return int(str(value).strip())
    except ValueError:
        raise ControlError(f"{name} must be an integer, got {str(value)[:40]!r}") from None
