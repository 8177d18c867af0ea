"""Profiling controls: a request from the page becomes a change of the run's live configuration, validated and
written the way `stallwatch config RUN` writes it (the job's sampler re-reads config.json and hands the change
to the job); whether the job picked it up is read back from the capture windows it wrote."""

from __future__ import annotations

import time
from typing import Any

from stallwatch.config import ConfigError, ProfilerConfig, ProfilingRange
from stallwatch.store import run_files

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


def request_status(request: dict[str, Any], windows: list[dict[str, Any]]) -> dict[str, Any]:
    """A request with what became of it: the capture windows of its layer that started after it was made."""
    layer = "python" if request["layer"] == "python" else "detailed"
    found = [w for w in windows if w.get("layer") == layer and isinstance(w.get("start_us"), int)
             and w["start_us"] >= request["requested_us"] - 1_000_000]
    if request["layer"] == "dataloader":
        found = []  # data-loader timing lands in the framework events, not in a capture window
    return {**request, "picked_up_us": min((w["start_us"] for w in found), default=None),
            "captures": [{"node": w.get("node"), "rank": w.get("rank"), "window": w.get("window"),
                          "start_us": w.get("start_us"), "end_us": w.get("end_us")} for w in found]}


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ControlError(f"{name} must be an integer")
    try:
        return int(str(value).strip())
    except ValueError:
        raise ControlError(f"{name} must be an integer, got {str(value)[:40]!r}") from None
