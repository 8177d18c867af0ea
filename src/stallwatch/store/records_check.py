"""A run's JSON records (run.json, nodes/<node>.json, window.json) turned into sane typed values: each known
field of the wrong type (or out of range) becomes absent, said in one line per file; unknown fields are left
out. What leaves the store is what docs/format.md documents, so no rule or renderer meets raw untrusted JSON."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from stallwatch.log import warn_once

MAX_TIME_US = 253_402_300_800 * 1_000_000  # 10000-01-01T00:00:00Z
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
_MAX_TEXT = 1 << 16  # characters of one string field; longer text is not a name, a path or a command word
_MAX_ITEMS = 100_000  # entries of one list field (ranks, metrics, GPUs)

Check = Callable[[Any], bool]


def _int(lo: int, hi: int) -> Check:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _number(lo: float, hi: float) -> Check:
    return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                      and lo <= v <= hi)


def _text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= _MAX_TEXT


def _optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _list_of(check: Check) -> Check:
    return lambda v: isinstance(v, list) and len(v) <= _MAX_ITEMS and all(check(x) for x in v)


def _dict_of(check: Check) -> Check:
    return lambda v: (isinstance(v, dict) and len(v) <= _MAX_ITEMS
                      and all(_text(k) and check(x) for k, x in v.items()))


def _record(fields: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    """A nested object: every known field present has its type, the required ones are present."""
    return lambda v: (isinstance(v, dict) and all(k in v for k in required)
                      and all(check(v[k]) for k, check in fields.items() if k in v))


def _config(v: Any) -> bool:
    """A ProfilerConfig's fields, all of them valid (the config the run started with)."""
    from stallwatch.config import ConfigError, ProfilerConfig

    if not isinstance(v, dict):
        return False
    try:
        ProfilerConfig.from_dict(v)
    except (ConfigError, TypeError, OverflowError):
        return False
    return True


def _json_object(v: Any) -> bool:
    """A JSON object of plain values, nested at most 6 deep and 100,000 values in all (an importer's
    provenance: where the data came from, what was counted)."""
    budget = [_MAX_ITEMS]

    def ok(x: Any, depth: int) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if x is None or isinstance(x, (bool, int)) or _text(x):
            return True
        if isinstance(x, float):
            return math.isfinite(x)
        if depth >= 6:
            return False
        if isinstance(x, dict):
            return all(_text(k) and ok(y, depth + 1) for k, y in x.items())
        return isinstance(x, list) and all(ok(y, depth + 1) for y in x)

    return isinstance(v, dict) and ok(v, 0)


def _signal(v: Any) -> bool:
    """A signal's name as the launcher writes it ("SIGTERM"; docs/format.md), or its number."""
    if isinstance(v, str):
        return 4 <= len(v) <= 16 and v.startswith("SIG") and v[3:].replace("+", "").replace("-", "").isalnum()
    return _int(1, 255)(v)


TIME = _int(0, MAX_TIME_US - 1)
COUNT = _int(0, _INT64)
PID = _int(0, _INT32)
SECONDS = _number(0.0, 1e12)
TEXT_LIST = _list_of(_text)

_GPU = _record({"index": _int(0, 1 << 16), "name": _text, "uuid": _text,
                "memory_total_bytes": _optional(COUNT)}, required=("index",))
_RANK = _record({"rank": _int(0, _INT32), "local_rank": _int(0, _INT32), "world_size": _int(1, _INT32),
                 "pid": _optional(PID)}, required=("rank",))  # null: unknown (an imported run)

_NIC = _record({"name": _text, "speed_mbps": _optional(_int(1, 1 << 40))}, required=("name",))

_COMPETITOR = _record({"pid": PID, "name": _text, "cpu_s": SECONDS}, required=("pid", "cpu_s"))

_INTERVAL_FROM = _record({"from_us": TIME, "sample_interval_ms": _int(1, 86_400_000)},
                         required=("from_us", "sample_interval_ms"))

_ATTEMPT = _record({"attempt": _int(1, 1_000_000), "start_us": _optional(TIME), "end_us": _optional(TIME),
                    "exit_code": _optional(_int(-(2**31), _INT32)), "exit_signal": _optional(_signal),
                    "hostname": _optional(_text), "status": _optional(_text)}, required=("attempt",))

RUN_FIELDS: dict[str, Check] = {
    "format_version": _int(0, 1 << 16), "run_id": _text, "created_us": TIME, "created_by_node": _text,
    "command": TEXT_LIST, "versions": _dict_of(_text), "config": lambda v: _config(v), "imported": _json_object,
}
NODE_FIELDS: dict[str, Check] = {
    "node": _text, "hostname": _text, "start_us": TIME, "end_us": _optional(TIME), "command": TEXT_LIST,
    "cwd": _text, "job_pid": PID, "exit_code": _optional(_int(-(2**31), _INT32)), "status": _text,
    "cpu_cores_logical": _int(1, 1 << 20), "cpu_cores_physical": _optional(_int(1, 1 << 20)),
    "memory_total_bytes": COUNT, "nics": _list_of(_NIC), "gpus": _list_of(_GPU), "gpu_driver": _optional(_text),
    "gpu_absent_reason": _optional(_text), "sample_interval_ms": _int(1, 86_400_000), "metrics": TEXT_LIST,
    "sample_intervals": _list_of(_INTERVAL_FROM), "ranks": _list_of(_RANK), "samples_written": COUNT, "samples_dropped": COUNT, "ticks_missed": COUNT,
    "sampler_cpu_s": SECONDS, "sampler_max_rss_bytes": COUNT, "platform": _text, "python": _text,
    "sampler_pid": PID, "sampler_end_us": TIME, "exit_signal": _optional(_signal),
    "interrupted": lambda v: isinstance(v, bool), "imported": _json_object,
    "cpu_competitors": _list_of(_COMPETITOR),
    "oom_kills": COUNT, "memory_limit_bytes": _optional(COUNT), "memory_peak_bytes": _optional(COUNT),  # the kernel's OOM killer in the job's cgroup
    "attempt": _int(1, 1_000_000), "attempt_start_us": TIME, "attempts": _list_of(_ATTEMPT),
}
WINDOW_FIELDS: dict[str, Check] = {
    "layer": _text, "start_us": TIME, "end_us": _optional(TIME), "mode": _text,
    "first_step": _optional(COUNT), "last_step": _optional(COUNT), "pid": PID, "status": _text,
    "range": _optional(_text), "profiler": _text, "activities": TEXT_LIST, "timer": _optional(_text),
    "node": _text, "rank": _int(0, _INT32), "window": _text, "files": TEXT_LIST, "summary_error": _optional(_text),
    "imported": _json_object,
}


def checked(data: dict[str, Any], fields: dict[str, Check], where: str) -> dict[str, Any]:
    """The known fields of `data` that have their documented type; the others are left out, and those of
    the wrong type are named in one line (once per file)."""
    out: dict[str, Any] = {}
    wrong: list[str] = []
    for key, check in fields.items():
        if key not in data:
            continue
        value = data[key]
        try:
            ok = check(value)
        except (RecursionError, TypeError, ValueError):
            ok = False
        if ok:
            out[key] = value
        else:
            wrong.append(f"{key} ({_kind(value)})")
    if wrong:
        warn_once(f"bad-fields-{where}", "%s: left out fields of the wrong type or range: %s (see docs/format.md)",
                  where, ", ".join(wrong))
    return out


def _kind(value: Any) -> str:
    if isinstance(value, (bool, type(None))):
        return repr(value)
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (int, float)):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__
