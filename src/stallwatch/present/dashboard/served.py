"""What one dashboard serves: a run, or the runs under a folder or bucket prefix. Run ids from a request are
checked against the names listed under the served root (never joined into a path unchecked), and each run keeps
one `RunAnalysis` while its files do not change, a new one once they do (a live run), and its built report."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.catalog import RunRow, run_rows
from stallwatch.analyze.live_view import LiveFigures, live_figures
from stallwatch.present.dashboard.answers import Answers
from stallwatch.present.dashboard.findings_job import FindingsJob
from stallwatch.store import layout
from stallwatch.store.catalog import list_runs, run_records
from stallwatch.store.live_status import live_version, read_live
from stallwatch.store.location import FileEntry, RunLocation, is_remote
from stallwatch.store.reader import Run, RunNotFoundError, open_run

CHECK_EVERY_S = 2.0  # how often a run's listing is looked at for changes, at most
LIVE_CHECK_S = 0.25  # how often the live counts' files are looked at, at most
LIVE_PREFIX = layout.LIVE_DIR + "/"
LIST_EVERY_S = 5.0


class NotServed(LookupError):
    """The id names no run this dashboard serves."""


class RootError(ValueError):
    """The root is neither a run nor a folder of runs (or cannot be read): one line saying which."""


@dataclass
class RunState:
    """One served run: its analysis while the run is unchanged, and its report per version."""
    id: str
    uri: str
    lock: threading.RLock = field(default_factory=threading.RLock)  # questions over all steps: asked once
    node_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _run: Run | None = None
    _analysis: RunAnalysis | None = None
    _fingerprint: tuple[int, int] | None = None
    _checked: float = 0.0
    version: int = 0
    report: tuple[int, bytes] | None = None
    report_lock: threading.Lock = field(default_factory=threading.Lock)
    latest_step: int | None = None  # the newest training step the live reader saw
    requests: list[dict[str, Any]] = field(default_factory=list)  # profiling requests made here
    answers: Answers = field(default_factory=Answers)  # every client's questions, answered once per stamp
    findings: FindingsJob = field(default_factory=FindingsJob)  # evaluated off the request path
    _live: tuple[Any, LiveFigures | None] = (None, None)  # (stamp of the live files, their figures)
    _live_checked: float = -1.0
    _live_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = open_run(self.uri)
        return self._run

    def analysis(self) -> RunAnalysis:
        """The run's analysis, new when the run's files changed since it was made (checked every few seconds)."""
        with self.lock:
            now = time.monotonic()
            if self._analysis is None or now - self._checked >= CHECK_EVERY_S:
                self._checked = now
                files = self.run.files()
                fp = fingerprint(files)
                if self._analysis is None or fp != self._fingerprint:
                    if self._analysis is not None:
                        self.version += 1
                    self._fingerprint = fp
                    # this listing answers the analysis's every listing: the run is listed once per state
                    self._analysis = RunAnalysis(self.run.listed(files), overview_from_rollups=True)
            return self._analysis

    def live(self) -> LiveFigures | None:
        """The nodes' live counts together (`live/<node>.json`), read again when a file changed (looked at no more
        often than every LIVE_CHECK_S, however many clients ask)."""
        with self._live_lock:
            now = time.monotonic()
            if now - self._live_checked < (CHECK_EVERY_S if self.run.location.remote else LIVE_CHECK_S):
                return self._live[1]
            self._live_checked = now
            nodes = self.analysis().nodes
            stamp = live_version(self.run.location, nodes)
            if stamp is None or stamp != self._live[0]:
                self._live = (stamp, live_figures(read_live(self.run.location, nodes)))
            return self._live[1]

    def stamp(self, live: bool = False) -> tuple[Any, ...]:
        """What an answer depends on: the run's stored state (its version), and with `live` its live counts."""
        self.analysis()
        if not live:
            return (self.version,)
        figures = self.live()
        return (self.version, None if figures is None else figures.written_us)

    def changed(self) -> None:
        """The live reader saw new data: the next question gets a fresh analysis."""
        with self.lock:
            self._checked = 0.0

    def node_lock(self, node: str) -> threading.Lock:
        with self.lock:
            return self.node_locks.setdefault(node, threading.Lock())


class ServedRuns:
    """The runs under `root` (or `root` itself when it is a run)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.single = False
        self._states: dict[str, RunState] = {}
        self._rows: list[RunRow] = []
        self._listed = 0.0
        self._lock = threading.Lock()
        self._check_root()

    def _check_root(self) -> None:
        loc = RunLocation(self.root)
        if not is_remote(self.root) and not os.path.isdir(self.root):
            raise RootError(f"{self.root} is not a folder: give a run directory, a folder of runs or s3://bucket/prefix")
        try:
            records = run_records(loc)
        except OSError as exc:
            raise RootError(f"cannot read {self.root}: {' '.join(str(exc).split())[:300]}") from None
        if records is not None:
            self.single = True
            name = self.root.rstrip("/").rsplit("/", 1)[-1].partition("?")[0]
            rid = layout.plain_name(name) or "run"
            self._states[rid] = RunState(rid, self.root)
            return
        try:
            loc.directories()
        except OSError as exc:
            raise RootError(f"cannot list {self.root}: {' '.join(str(exc).split())[:300]}") from None

    def rows(self) -> list[RunRow]:
        """The served runs, newest first (listed again at most every few seconds)."""
        with self._lock:
            if time.monotonic() - self._listed < LIST_EVERY_S and self._rows:
                return self._rows
            found = list_runs(self.root)
            if self.single:
                found = found[:1]
                for rec in found:
                    rec.name = next(iter(self._states))
            self._rows = run_rows(found)
            self._listed = time.monotonic()
            return self._rows

    def ids(self) -> list[str]:
        return [_row_id(r) for r in self.rows()]

    def state(self, run_id: str) -> RunState:
        """The served run `run_id`; NotServed for any id that is not one of the listed runs' names."""
        if not isinstance(run_id, str) or layout.plain_name(run_id) != run_id:
            raise NotServed(run_id)
        with self._lock:
            if run_id in self._states:
                return self._states[run_id]
        if self.single:
            raise NotServed(run_id)
        loc = RunLocation(self.root)
        if run_id not in loc.directories():
            raise NotServed(run_id)
        child = loc.child(run_id)
        if not child.remote and not _inside(self.root, str(child.local_path())):
            raise NotServed(run_id)  # a symlink out of the served folder
        try:
            open_run(child.uri)
        except RunNotFoundError:
            raise NotServed(run_id) from None
        with self._lock:
            return self._states.setdefault(run_id, RunState(run_id, child.uri))


def _row_id(row: RunRow) -> str:
    name = row.uri.rstrip("/").rsplit("/", 1)[-1].partition("?")[0]
    return layout.plain_name(name) or row.id


def row_id(row: RunRow, served: ServedRuns) -> str:
    return next(iter(served._states)) if served.single else _row_id(row)


def _inside(root: str, path: str) -> bool:
    if not path:
        return False
    real_root = os.path.realpath(root)
    return os.path.commonpath([real_root, os.path.realpath(path)]) == real_root


def fingerprint(files: list[FileEntry]) -> tuple[int, int]:
    """A run's state as its files' count and total size: new data changes it (files only grow or are replaced).
    The live counts, rewritten every second, are not part of it (they have a stamp of their own)."""
    stored = [f for f in files if not f.path.startswith(LIVE_PREFIX)]
    return len(stored), sum(f.size for f in stored)
