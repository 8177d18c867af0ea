"""A folder (or bucket prefix) of runs: which of its directories are runs, and their small records read
without touching samples or events — run.json, the node records and findings.json — so listing a bucket of
hundreds of runs costs a few small reads each, on a few threads."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stallwatch.log import warn_once
from stallwatch.store import layout, run_files
from stallwatch.store.location import FileEntry, RunLocation
from stallwatch.store.node_record import NodeRecord
from stallwatch.store.records_check import NODE_FIELDS, checked

READERS = 8  # runs read at once (network round trips dominate on S3)
MAX_RECORD_BYTES = 1 << 20


@dataclass
class RunRecords:
    """What a run says about itself: its `run.json`, each node's record and its findings (any may be missing)."""
    uri: str
    name: str
    run: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    findings: dict[str, Any] | None = None


def is_run(location: RunLocation) -> bool:
    """Whether `location` is a run directory: it holds run.json, or node records (a run whose run.json was
    never written)."""
    return location.exists(layout.RUN_JSON) or (bool(_node_files(location)) and not _nested_run(location))


def _node_files(location: RunLocation) -> list[FileEntry]:
    """The node records directly under nodes/ (listed first: an unreachable store fails here, in one line)."""
    return [e for e in location.list(layout.NODES_DIR, recursive=False) if e.path.endswith(".json")]


def _nested_run(location: RunLocation) -> bool:
    """A nodes/ that holds folders is a run named `nodes` inside a folder of runs, not this folder's records (a
    run's nodes/ holds files only); asked only where there is no run.json."""
    return bool(location.directories(layout.NODES_DIR))


def run_records(location: RunLocation, name: str | None = None) -> RunRecords | None:
    """The records of the run at `location`, or None when it is not a run (see `is_run`)."""
    node_files = _node_files(location)
    run = _object(location, layout.RUN_JSON)
    if run is None and node_files and _nested_run(location):
        node_files = []
    if run is None and not node_files:
        return None
    nodes = {}
    for entry in node_files:
        record = _object(location, entry.path)
        if record is not None:
            node = entry.path.rsplit("/", 1)[-1][:-5]
            nodes[node] = NodeRecord.from_json(node, checked(record, NODE_FIELDS, f"{location.uri}/{entry.path}"))
    return RunRecords(location.uri, name or location.uri.rstrip("/").rsplit("/", 1)[-1], run or {}, nodes,
                      run_files.read_findings(location))


def list_runs(root: str) -> list[RunRecords]:
    """Every run directly under `root` (a local folder or s3://bucket/prefix), or `root` itself when it is one."""
    location = RunLocation(root)
    itself = run_records(location)
    if itself is not None:
        return [itself]
    names = location.directories()
    with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="stallwatch-ls") as pool:
        found = pool.map(lambda n: run_records(location.child(n), n), names)
        return [r for r in found if r is not None]


def _object(location: RunLocation, rel: str) -> dict[str, Any] | None:
    try:
        data = location.read(rel)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warn_once(f"catalog-{location.uri}-{rel}", "cannot read %s/%s (%s)", location.uri, rel, exc)
        return None
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
