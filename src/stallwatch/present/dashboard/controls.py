"""Profiling controls: a request from the page becomes a change of the run's live configuration, validated and
written the way `stallwatch config RUN` writes it (the job's sampler re-reads config.json and hands the change
to the job); whether the job picked it up is read back from the capture windows it wrote."""

from __future__ import annotations

import time
from typing import Any

from stallwatch.config import SAMPLE_INTERVAL_PRESETS_MS, ConfigError, ProfilerConfig, ProfilingRange
from stallwatch.present.dashboard.documents import capture
from stallwatch.store import run_files
from stallwatch.store.node_record import NodeRecord

LAYERS = {"detailed": "detailed_profiling", "dataloader": "dataloader_profiling", "python": "python_profiling"}
STEP_MARGIN = 2  # steps between the newest step seen here and the first profiled one (events reach the store late)


class ControlError(ValueError):
    """A request that cannot be applied; the message says why and what is allowed."""


def current_config(location: Any) -> ProfilerConfig:
    try:
        return run_files.read_config(location)
    except FileNotFoundError:
        return ProfilerConfig()
    except (ConfigError, OSError) as exc:
        raise ControlError(f"the run's config.json cannot be changed: {exc}") from None


def profiling_range(layer: str, body: dict[str, Any], latest_step: int | None) -> ProfilingRange:
    """The window a request asks for: N steps from a start step (blank: the current step), or a time range."""
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
                start_step = 0 if latest_step is None else latest_step + STEP_MARGIN
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


def request_status(request: dict[str, Any], windows: list[dict[str, Any]]) -> dict[str, Any]:
    """A request with what became of it: the capture windows of its layer that started after it was made."""
    layer = "python" if request["layer"] == "python" else "detailed"
    found = [w for w in windows if w.get("layer") == layer and isinstance(w.get("start_us"), int)
             and w["start_us"] >= request["requested_us"] - 1_000_000]
    if request["layer"] == "dataloader":
        found = []  # data-loader timing lands in the framework events, not in a capture window
    return {**request, "picked_up_us": min((w["start_us"] for w in found), default=None),
            "captures": [capture(w) for w in found]}


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ControlError(f"{name} must be an integer")
    try:
        return int(str(value).strip())
    except ValueError:
        raise ControlError(f"{name} must be an integer, got {str(value)[:40]!r}") from None
