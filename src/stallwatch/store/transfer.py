"""Copying a run (or what an outage left in the local spool) to another location, never overwriting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from stallwatch.store import layout
from stallwatch.store.location import RunLocation

# Written once by the first node of a run; a copy must not replace the destination's own.
_CREATE_ONCE = (layout.RUN_JSON, layout.CONFIG_JSON)


@dataclass
class TransferResult:
    copied: list[str]
    skipped: list[str]  # already at the destination with the same size (or created once there)


def copy_run(source: RunLocation, dest: RunLocation, *, delete_source: bool = False,
             progress: Callable[[int, int], None] | None = None) -> TransferResult:
    """Data first, node records after, so a reader of the destination never sees a node without data.
    `progress(bytes_done, bytes_total)` after each file."""
    entries = source.list("")
    order = sorted(entries, key=lambda e: (e.path.startswith(layout.NODES_DIR + "/"), e.path in _CREATE_ONCE, e.path))
    existing = {e.path: e.size for e in dest.list("")}
    result = TransferResult([], [])
    total, done = sum(e.size for e in order), 0
    for entry in order:
        done += entry.size
        if progress is not None:
            progress(done, total)
        if entry.path in _CREATE_ONCE:
            (result.copied if dest.create_exclusive(entry.path, source.read(entry.path)) else result.skipped).append(entry.path)
        elif existing.get(entry.path) == entry.size:
            result.skipped.append(entry.path)
        else:
            dest.write_atomic(entry.path, source.read(entry.path))
            result.copied.append(entry.path)
    # Parts compacted into a segment meanwhile are leftovers at the destination: readers skip them anyway.
    if delete_source:
        for entry in entries:
            source.delete(entry.path)
    return result
