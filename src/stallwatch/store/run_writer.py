"""A run's records written by a producer other than the sampler (an importer): run.json and config.json,
node records, complete profiling windows and rule results. Paths come from `layout`; every file is atomic and
nothing already in the run is replaced except what the caller owns (its nodes, windows and results)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stallwatch.store import layout
from stallwatch.store.location import RunLocation


class RunExistsError(FileExistsError):
    """The destination already holds a run (or part of one): an import never writes into it."""


def _json(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, indent=2, sort_keys=True, default=str) + "\n").encode()


def create_run(location: RunLocation, run_record: Mapping[str, Any], config_json: str) -> None:
    """run.json and config.json of a new run; raises RunExistsError when the location is not empty (a run is
    never imported over another one, nor into a directory holding anything else)."""
    if location.list(""):
        raise RunExistsError(f"{location.uri} is not empty; give a new --out (an import never writes into an "
                             "existing directory)")
    if not location.create_exclusive(layout.RUN_JSON, _json(run_record)):
        raise RunExistsError(f"{location.uri} already holds a run")
    location.create_exclusive(layout.CONFIG_JSON, (config_json.rstrip("\n") + "\n").encode())


def update_run_record(location: RunLocation, run_record: Mapping[str, Any]) -> None:
    """Replace run.json of a run this producer created (e.g. with the import's final counts)."""
    location.write_atomic(layout.RUN_JSON, _json(run_record))


def write_node_record(location: RunLocation, node: str, record: Mapping[str, Any]) -> None:
    """nodes/<node>.json: the machine's facts, span and ranks (see docs/format.md)."""
    location.write_atomic(layout.node_json(node), _json(record))


def write_profile_window(location: RunLocation, node: str, rank: int | str, window: str,
                         files: Mapping[str, bytes], record: Mapping[str, Any]) -> str:
    """A complete profiling window: its data files, then window.json (its presence means complete). Returns
    the window's directory in the run."""
    if not layout.valid_window_name(window):
        raise ValueError(f"window name {window!r} is not one safe path segment")
    directory = layout.trace_window_dir(node, rank, window)
    for name, data in files.items():
        if name == layout.WINDOW_JSON or "/" in name or name.startswith("."):
            raise ValueError(f"file name {name!r} cannot be stored in a window")
        location.write_atomic(f"{directory}/{name}", data)
    location.write_atomic(f"{directory}/{layout.WINDOW_JSON}", _json({**record, "files": list(files)}))
    return directory
