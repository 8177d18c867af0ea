"""The run's small JSON files other than its records: the profiling configuration (`config.json`, which the
running job re-reads), the rules' results (`rules/<RuleName>.json`) and the ranked findings (`findings.json`).
Their paths are known here only; what they hold is validated on the way in and out (a run is untrusted)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from stallwatch.config import MAX_CONFIG_BYTES, ConfigError, ProfilerConfig
from stallwatch.log import warn_once
from stallwatch.store import layout

FINDINGS_JSON = "findings.json"
MAX_JSON_BYTES = 16 * 1024 * 1024  # a rule result or findings file larger than this is not read
_RULE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def read_config(location: Any) -> ProfilerConfig:
    """The run's configuration. Raises FileNotFoundError when it has none and ConfigError (naming the field)
    when it is not a valid one."""
    return ProfilerConfig.from_json_bytes(location.read(layout.CONFIG_JSON, MAX_CONFIG_BYTES), layout.CONFIG_JSON)


def config_or_default(location: Any) -> ProfilerConfig:
    """The run's configuration, or the defaults when it has none or an invalid one (said once)."""
    try:
        return read_config(location)
    except FileNotFoundError:
        return ProfilerConfig()
    except (ConfigError, OSError) as exc:
        warn_once(f"bad-config-{location.uri}", "the run's %s cannot be used (%s); defaults assumed",
                  layout.CONFIG_JSON, exc)
        return ProfilerConfig()


def write_config(location: Any, config: ProfilerConfig) -> None:
    """Replace the run's configuration atomically (the running job picks up its live fields)."""
    location.write_atomic(layout.CONFIG_JSON, (config.to_json() + "\n").encode())


def valid_rule_name(name: str) -> bool:
    """A rule's name is one safe path segment (it names its result file)."""
    return isinstance(name, str) and bool(_RULE_NAME.match(name))


def rule_result_path(name: str) -> str:
    """Where a rule's result lives in the run: `rules/<name>.json`."""
    if not valid_rule_name(name):
        raise ValueError(f"rule name {name!r} cannot name a file: use letters, digits, '_', '.', '-'")
    return f"{layout.RULES_DIR}/{name}.json"


def write_rule_result(location: Any, name: str, record: Mapping[str, Any]) -> str:
    """`rules/<name>.json`, written atomically; returns its path in the run."""
    rel = rule_result_path(name)
    location.write_atomic(rel, (json.dumps(record, indent=2, default=jsonable) + "\n").encode())
    return rel


def read_rule_results(location: Any) -> dict[str, dict[str, Any]]:
    """Every stored rule result as its JSON object, by rule name (file name order). Files that are not a JSON
    object, too large or unreadable are skipped with one log line each."""
    out: dict[str, dict[str, Any]] = {}
    for entry in sorted(location.list(layout.RULES_DIR, recursive=False), key=lambda e: e.path):
        stem = entry.path.rsplit("/", 1)[-1]
        if not stem.endswith(".json") or not valid_rule_name(stem[:-5]):
            continue
        record = _read_object(location, entry.path, entry.size)
        if record is not None:
            out[stem[:-5]] = record
    return out


def write_findings(location: Any, document: Mapping[str, Any]) -> str:
    location.write_atomic(FINDINGS_JSON, (json.dumps(document, indent=2, default=jsonable) + "\n").encode())
    return FINDINGS_JSON


def read_findings(location: Any) -> dict[str, Any] | None:
    try:
        size = next((e.size for e in location.list("", recursive=False) if e.path == FINDINGS_JSON), None)
    except OSError:
        return None
    return None if size is None else _read_object(location, FINDINGS_JSON, size)


def write_report(location: Any, data: bytes) -> str:
    """`report.html` at the run's root, atomically; where it went (a local path, or the object's URI)."""
    location.write_atomic(layout.REPORT_HTML, data)
    return report_uri(location)


def report_uri(location: Any) -> str:
    """Where a run's `report.html` is (or will be): a local path, or the object's URI."""
    if location.remote:  # s3://bucket/prefix/run[?endpoint_override=…] -> …/run/report.html[?…]
        base, sep, query = location.uri.partition("?")
        return f"{base.rstrip('/')}/{layout.REPORT_HTML}{sep}{query}"
    return str(location.local_path(layout.REPORT_HTML))


def write_file_atomic(path: str | os.PathLike[str], data: bytes) -> str:
    """A local file outside any run (the user named it), written atomically; its absolute path."""
    from stallwatch.store.location import RunLocation

    target = Path(path).expanduser().absolute()
    RunLocation(str(target.parent)).write_atomic(target.name, data)
    return str(target)


def _read_object(location: Any, rel: str, size: int) -> dict[str, Any] | None:
    if size > MAX_JSON_BYTES:
        warn_once(f"big-json-{location.uri}-{rel}", "skipping %s/%s: %d bytes, more than the %d a result may have",
                  location.uri, rel, size, MAX_JSON_BYTES)
        return None
    try:
        data = json.loads(location.read(rel))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        warn_once(f"bad-json-{location.uri}-{rel}", "skipping unreadable %s/%s (%s)", location.uri, rel, exc)
        return None
    if not isinstance(data, dict):
        warn_once(f"bad-json-{location.uri}-{rel}", "skipping %s/%s (a JSON object was expected, not %s)",
                  location.uri, rel, type(data).__name__)
        return None
    return data


def jsonable(value: Any) -> Any:
    """numpy scalars and arrays in details become plain JSON."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


# -- escalations: automatic captures asked for by firing rules ---------------------------------------------------

def write_escalation(location: Any, record: Mapping[str, Any]) -> str:
    """escalations/<start_us>-<rule>.json: what fired, when, and the capture it asked for."""
    rule = re.sub(r"[^A-Za-z0-9_.-]", "_", str(record.get("rule", "rule")))[:100]
    rel = f"{layout.ESCALATIONS_DIR}/{int(record.get('start_us', 0))}-{rule}.json"
    location.write_atomic(rel, json.dumps(dict(record), default=str).encode())
    return rel


def read_escalations(location: Any) -> list[dict[str, Any]]:
    """The run's escalation records in time order; unreadable or malformed ones are skipped (said once)."""
    out = []
    for entry in location.list(layout.ESCALATIONS_DIR):
        if not entry.path.endswith(".json") or entry.size > 1 << 20:
            continue
        try:
            record = json.loads(location.read(entry.path))
        except (OSError, ValueError) as exc:
            warn_once(f"escalation-{entry.path}", "skipping %s: %s", entry.path, exc)
            continue
        if isinstance(record, dict) and isinstance(record.get("rule"), str) and isinstance(record.get("start_us"), int):
            out.append({k: record[k] for k in ("rule", "start_us", "end_us", "layers", "evidence", "reason")
                        if k in record})
    return sorted(out, key=lambda r: r["start_us"])
