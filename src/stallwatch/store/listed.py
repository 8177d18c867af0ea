"""A run location that lists the store once: an analysis asking many questions of a run that does not change
between them (a finished run; a live run's state at one moment) lists thousands of files once, not per question.
A listed file found gone (parts compacted into a segment since) renews the listing."""

from __future__ import annotations

import bisect
import threading
from typing import Callable, TypeVar

from stallwatch.store.location import FileEntry, RunLocation

T = TypeVar("T")


class ListedLocation(RunLocation):
    """`base`'s files as `files` (one listing of the whole run); everything but `list` is `base`'s."""

    def __init__(self, base: RunLocation, files: list[FileEntry]) -> None:
        self.__dict__.update(base.__dict__)
        self._snapshot_lock = threading.Lock()
        self._take(files)

    def _take(self, files: list[FileEntry]) -> None:
        ordered = sorted(files, key=lambda f: f.path)
        with self._snapshot_lock:
            self._entries, self._paths = ordered, [f.path for f in ordered]
            self._derived: dict[str, object] = {}

    def derived(self, key: str, make: Callable[[], T]) -> T:
        """What `make` computes from this listing (the parsed chunks of a folder), kept until the listing renews."""
        with self._snapshot_lock:
            if key in self._derived:
                return self._derived[key]  # type: ignore[return-value]
        value = make()
        with self._snapshot_lock:
            self._derived.setdefault(key, value)
        return value

    def list(self, rel_dir: str, recursive: bool = True) -> list[FileEntry]:
        prefix = rel_dir.strip("/")
        prefix = f"{prefix}/" if prefix else ""
        with self._snapshot_lock:
            entries, paths = self._entries, self._paths
        lo = bisect.bisect_left(paths, prefix)
        hi = bisect.bisect_left(paths, prefix + "\U0010ffff") if prefix else len(paths)
        found = entries[lo:hi]
        return found if recursive else [f for f in found if "/" not in f.path[len(prefix):]]

    def open_input_file(self, rel: str):
        try:
            return super().open_input_file(rel)
        except FileNotFoundError:
            try:
                self._take(super().list(""))  # the run moved on: later questions see what is there now
            except Exception:  # the store out of reach: keep the old listing; the caller handles the missing file
                pass
            raise
