"""The sampler's side of profiling windows: the job stages raw profiler output in a private directory and
says so over the event socket; a background thread here stores it in the run (through the sink, so S3
runs spool), adds small summaries, and deletes the staged files. The sampling loop only enqueues."""

from __future__ import annotations

import gzip
import io
import json
import logging
import marshal
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from stallwatch.collect import profile_summary
from stallwatch.log import logger, warn_once
from stallwatch.store import layout, profiles_codec, trace_codec
from stallwatch.store.chunk_writer import Sink, StorageBudget

QUEUE_SIZE = 16
MAX_SUMMARY_BYTES = 512 * 2**20  # a bigger trace is stored but not summarized (it would take minutes)
MAX_TRACE_BYTES = trace_codec.MAX_TRACE_JSON_BYTES  # a bigger one is not stored: nothing could read it back
GZIP_LEVEL = 6
_READ_CHUNK = 1 << 20
# The staged files each layer may send, under the names they are stored with (or turned into).
STAGED_NAMES = {
    "detailed": frozenset({"trace.json"}),
    "python": frozenset({layout.PSTATS, layout.PYINSTRUMENT_JSON}),
    "memory": frozenset({layout.MEMORY_SITES_JSON, layout.CUDA_MEMORY_PICKLE}),  # stored as they are
}


class ArtifactError(ValueError):
    """An artifact message that is refused: nothing of it is stored. `what` groups the one-time warnings."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


@dataclass
class Window:
    """One validated artifact: where it goes and the staged files it brings (opened safely later)."""

    rank: int
    layer: str
    window: str
    staged: dict[str, str]  # stored name -> real path inside the staging directory
    meta: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)  # what will be written, in order
    summary_error: str | None = None


class ArtifactStore:
    """Stores profiling windows in the run on one background thread; `submit` never blocks or raises."""

    def __init__(self, sink: Sink, node: str, staging_dir: str, budget: StorageBudget | None = None) -> None:
        self._sink = sink
        self._node = node
        self._staging = os.path.realpath(staging_dir)
        self._budget = budget
        self._queue: queue.Queue[Window | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._closed = False
        self._deadline: float | None = None  # set by close(): work after it is given up
        self._busy: Window | None = None  # the window the thread is storing now
        self.stored = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="stallwatch-artifacts", daemon=True)
        self._thread.start()

    # -- the sampler's side -----------------------------------------------------------------------------
    def submit(self, rank: int, artifact: dict[str, Any]) -> None:
        """Queue one window for storing; a refused or unqueueable one is said once and its staged files go."""
        try:
            item = self._validate(rank, artifact)
        except ArtifactError as exc:
            self.dropped += 1
            warn_once(f"artifact-refused-{exc.what}", "refusing a profiling window from rank %s: %s", rank, exc)
            self._discard_message(artifact)
            return
        except Exception as exc:  # never into the sampling loop
            self.dropped += 1
            warn_once(f"artifact-submit-{type(exc).__name__}", "refusing a profiling window from rank %s (%s: %s)",
                      rank, type(exc).__name__, exc)
            return
        if self._closed:
            self._drop(item, "the sampler is stopping")
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._drop(item, f"{QUEUE_SIZE} windows are already waiting to be stored")

    def close(self, timeout_s: float) -> None:
        """Store what is queued within `timeout_s`; what is left is dropped (one line) with its staged files."""
        try:
            self._closed = True
            self._deadline = time.monotonic() + max(0.0, timeout_s)
            try:
                self._queue.put(None, timeout=max(0.0, timeout_s))
            except queue.Full:
                pass
            self._thread.join(max(0.0, self._deadline - time.monotonic()))
            left = len(self._drain())
            if self._thread.is_alive():
                left += self._busy is not None  # it gives up at its next step and deletes its staged files
                try:
                    self._queue.put_nowait(None)  # the drain may have taken the stop sentinel
                except queue.Full:
                    pass
            if left:
                logger.warning("%d profiling window(s) could not be stored within %.1f s and were dropped",
                               left, timeout_s)
        except Exception as exc:
            logger.warning("stopping the profile store failed (%s: %s)", type(exc).__name__, exc)

    # -- validation -------------------------------------------------------------------------------------
    def _validate(self, rank: Any, artifact: Any) -> Window:
        if not isinstance(artifact, dict):
            raise ArtifactError("message", "the message is not an object")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ArtifactError("rank", f"bad rank {rank!r}")
        layer, window = artifact.get("layer"), artifact.get("window")
        if layer not in STAGED_NAMES:
            raise ArtifactError("layer", f"unknown layer {layer!r} (expected one of {', '.join(STAGED_NAMES)})")
        if not layout.valid_window_name(window):
            raise ArtifactError("window", f"bad window name {window!r} (1-128 letters, digits, '.', '_', '-', "
                                "not starting with '.')")
        files, meta = artifact.get("files"), artifact.get("meta", {})
        if not isinstance(files, dict) or not files:
            raise ArtifactError("files", "it names no files")
        if not isinstance(meta, dict):
            raise ArtifactError("meta", "its meta is not an object")
        unknown = sorted(str(n) for n in files if n not in STAGED_NAMES[layer])
        if unknown:
            raise ArtifactError("names", f"unexpected file name(s) {', '.join(unknown)} for layer {layer}")
        staged = {name: self._staged_path(path) for name, path in files.items()}
        return Window(rank, layer, window, staged, meta)

    def _staged_path(self, path: Any) -> str:
        """The real path of a regular file inside the staging directory; anything else is refused."""
        if not isinstance(path, str) or not os.path.isabs(path):
            raise ArtifactError("path", f"staged path {path!r} is not absolute")
        try:
            real = os.path.realpath(path)
            inside = os.path.commonpath([real, self._staging]) == self._staging and real != self._staging
        except (OSError, ValueError):  # a NUL byte, a loop of links
            raise ArtifactError("path", f"staged path {path!r} cannot be resolved") from None
        if not inside:
            raise ArtifactError("outside", f"staged file {path} is outside the staging directory {self._staging}")
        try:
            st = os.lstat(path)
        except (OSError, ValueError) as exc:
            raise ArtifactError("missing", f"staged file {path} cannot be read "
                                f"({getattr(exc, 'strerror', None) or exc})") from None
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError("irregular", f"staged file {path} is not a regular file")
        return real

    def _discard_message(self, artifact: Any) -> None:
        """Delete the staged files of a refused message, but only those that are really ours to delete."""
        files = artifact.get("files") if isinstance(artifact, dict) else None
        ours = []
        for path in (files.values() if isinstance(files, dict) else ()):
            try:
                ours.append(self._staged_path(path))
            except Exception:  # refused paths are not ours to delete
                pass
        self._remove_staged(ours)

    # -- the background thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get()
            except Exception:  # pragma: no cover - Queue.get does not fail
                return
            if item is None:
                return
            self._busy = item
            try:
                if self._late():
                    self._drop(item, "the sampler is stopping", quiet=True)
                else:
                    self._store(item)
            except Exception as exc:  # one bad window must not end storing the next ones
                self.dropped += 1
                if not self._late():  # past close()'s deadline, close() has said it in its one line
                    warn_once(f"artifact-store-{type(exc).__name__}", "storing profiling window %s failed (%s: %s)",
                              item.window, type(exc).__name__, exc)
            finally:
                self._delete_staged(item)
                item.files.clear()
                self._busy = None

    def _store(self, w: Window) -> None:
        if w.layer == "detailed":
            self._prepare_detailed(w)
        elif w.layer == "memory":  # tracemalloc's top sites, PyTorch's allocator history: kept as written
            for name, path in w.staged.items():
                w.files[name] = _read_staged(path)
        else:
            self._prepare_python(w)
        if self._late():
            raise TimeoutError("the sampler stopped before the window was stored")
        record = {**w.meta, "layer": w.layer, "node": self._node, "rank": w.rank, "window": w.window,
                  "files": list(w.files), "summary_error": w.summary_error}
        w.files[layout.WINDOW_JSON] = json.dumps(record, indent=2, sort_keys=True, default=str).encode()
        size = sum(len(d) for d in w.files.values())
        if self._budget is not None and self._budget.used + size > self._budget.limit:
            self.dropped += 1
            warn_once(f"artifact-cap-{self._node}", "storage cap of %.0f MB reached; profiling window %s "
                      "(%.1f MB) and later ones that do not fit are not stored. Raise max_storage_mb to keep more.",
                      self._budget.limit / 2**20, w.window, size / 2**20)
            return
        directory = layout.trace_window_dir(self._node, w.rank, w.window)
        written: list[tuple[str, int]] = []
        try:
            for name, data in w.files.items():  # window.json is last: its presence means complete
                if self._late():
                    raise TimeoutError("the sampler stopped while the window was being stored")
                self._sink.write_atomic(f"{directory}/{name}", data)
                written.append((f"{directory}/{name}", len(data)))
                if self._budget is not None:
                    self._budget.add(len(data))
        except Exception:
            self._undo(written)
            raise
        self.stored += 1
        logger.debug("stored profiling window %s (%d files, %.1f MB)", directory, len(written), size / 2**20)

    def _prepare_detailed(self, w: Window) -> None:
        path = w.staged["trace.json"]
        try:
            raw, compressed, _ = _read_and_gzip(path)
        except _TooBig as exc:
            w.summary_error = (f"its trace holds more than {MAX_TRACE_BYTES / 2**20:.0f} MB of JSON and was not "
                               "stored; profile fewer steps")
            warn_once("artifact-trace-too-big-to-store", "profiling window %s: %s (%s)", w.window, w.summary_error,
                      exc)
            return
        w.files[layout.TRACE_JSON_GZ] = compressed
        if raw > MAX_SUMMARY_BYTES:
            w.summary_error = f"trace of {raw / 2**20:.0f} MB is larger than {MAX_SUMMARY_BYTES / 2**20:.0f} MB"
            warn_once("artifact-trace-too-big", "profiling window %s: %s; it is stored without operators.parquet",
                      w.window, w.summary_error)
            return

        def operators() -> bytes:
            # Streamed one event at a time: json.load of a 500 MB trace took the sampler past 1.5 GB.
            with io.BytesIO(compressed) as fh:
                events = trace_codec.iter_events(fh, max_bytes=MAX_SUMMARY_BYTES)
                return profiles_codec.encode_operators(profile_summary.operator_rows(events))

        self._summarize(w, layout.OPERATORS_PARQUET, operators)

    def _prepare_python(self, w: Window) -> None:
        if layout.PSTATS in w.staged:
            data = _read_staged(w.staged[layout.PSTATS])
            w.files[layout.PSTATS] = data
            self._summarize(w, layout.FUNCTIONS_PARQUET, lambda: profiles_codec.encode_functions(
                profile_summary.pstats_rows(marshal.loads(data))))
        if layout.PYINSTRUMENT_JSON in w.staged:
            data = _read_staged(w.staged[layout.PYINSTRUMENT_JSON])
            w.files[layout.PYINSTRUMENT_JSON] = data
            try:
                from pyinstrument.renderers import HTMLRenderer
                from pyinstrument.session import Session
            except ImportError:
                w.summary_error = "pyinstrument is not installed where the sampler runs"
                warn_once("artifact-no-pyinstrument", "pyinstrument cannot be imported in the sampler; "
                          "pyinstrument windows are stored as JSON only (no HTML, no functions.parquet)")
                return
            try:
                session = Session.from_json(json.loads(data))
            except Exception as exc:
                self._summary_failed(w, "reading the pyinstrument session", exc)
                return
            self._summarize(w, layout.PYINSTRUMENT_HTML, lambda: HTMLRenderer().render(session).encode())
            self._summarize(w, layout.FUNCTIONS_PARQUET, lambda: profiles_codec.encode_functions(
                profile_summary.pyinstrument_rows(session.root_frame())))

    def _summarize(self, w: Window, name: str, make: Callable[[], bytes]) -> None:
        """Add a derived file; a failure leaves the raw output stored and says why in window.json."""
        try:
            w.files[name] = make()
        except Exception as exc:
            self._summary_failed(w, f"making {name}", exc)

    def _summary_failed(self, w: Window, what: str, exc: Exception) -> None:
        error = f"{what} failed: {type(exc).__name__}: {str(exc)[:200]}"
        w.summary_error = error if w.summary_error is None else f"{w.summary_error}; {error}"
        warn_once(f"artifact-summary-{what}-{type(exc).__name__}", "profiling window %s: %s (stored without it)",
                  w.window, error)

    # -- dropping and cleaning up -----------------------------------------------------------------------
    def _late(self) -> bool:
        return self._deadline is not None and time.monotonic() > self._deadline

    def _drop(self, w: Window, why: str, quiet: bool = False) -> None:
        self.dropped += 1
        if not quiet:
            warn_once(f"artifact-drop-{why}", "dropping profiling window %s of rank %d: %s", w.window, w.rank, why)
        self._delete_staged(w)

    def _drain(self) -> list[Window]:
        left = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return left
            if item is not None:
                self.dropped += 1
                self._delete_staged(item)
                left.append(item)

    def _undo(self, written: list[tuple[str, int]]) -> None:
        """Remove the files of a window that could not be stored whole (a window without window.json is
        ignored by readers anyway, but it should not hold storage)."""
        for rel, size in reversed(written):
            try:
                self._sink.delete(rel)
                if self._budget is not None:
                    self._budget.add(-size)
            except Exception as exc:
                warn_once("artifact-undo", "could not remove %s of an incomplete window (%s)", rel, exc,
                          level=logging.INFO)

    def _delete_staged(self, w: Window) -> None:
        self._remove_staged(w.staged.values())

    def _remove_staged(self, paths: Iterable[str]) -> None:
        """Delete staged files, then the per-window folders the job made for them once they are empty."""
        folders = set()
        for path in paths:
            self._unlink(path)
            folders.add(os.path.dirname(path))
        for folder in folders:
            if folder != self._staging and os.path.commonpath([folder, self._staging]) == self._staging:
                try:
                    os.rmdir(folder)
                except OSError:  # not empty (another file of the window is still there) or gone
                    pass

    @staticmethod
    def _unlink(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            warn_once("artifact-unlink", "could not delete staged file %s (%s)", path, exc.strerror or exc)


def open_staged(path: str) -> io.BufferedReader:
    """Open without following a symlink swapped in since validation, and only a regular file."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArtifactError("irregular", f"staged file {path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_staged(path: str) -> bytes:
    with open_staged(path) as fh:
        return fh.read()


class _TooBig(Exception):
    """A staged trace past MAX_TRACE_BYTES."""


def _read_and_gzip(path: str) -> tuple[int, bytes, bool]:
    """(size of the JSON, its gzip, whether it came gzipped) read in chunks; an already gzipped trace
    (torch writes one for a `.gz` name) is kept as it is. _TooBig past MAX_TRACE_BYTES of JSON: memory
    holds the compressed trace, and nothing could read a bigger one back (the timeline's limit)."""
    with open_staged(path) as fh:
        head = fh.read(2)
        if head == b"\x1f\x8b":
            data = head + fh.read(MAX_TRACE_BYTES)
            if len(data) > MAX_TRACE_BYTES:
                raise _TooBig(f"{len(data) / 2**20:.0f} MB gzipped")
            return _gunzipped_size(data), data, True
        buf = io.BytesIO()
        raw = len(head)
        with gzip.GzipFile(filename="trace.json", mode="wb", fileobj=buf, compresslevel=GZIP_LEVEL, mtime=0) as gz:
            gz.write(head)
            while chunk := fh.read(_READ_CHUNK):
                gz.write(chunk)
                raw += len(chunk)
                if raw > MAX_TRACE_BYTES:
                    raise _TooBig(f"{raw / 2**20:.0f} MB read so far")
        return raw, buf.getvalue(), False


def _gunzipped_size(data: bytes) -> int:
    size = trace_codec.json_size(io.BytesIO(data), MAX_TRACE_BYTES)
    if size > MAX_TRACE_BYTES:
        raise _TooBig("gzipped by the job")
    return size
