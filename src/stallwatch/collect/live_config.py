"""The sampler's watch on the run's config.json: a change to a live field (profiling windows) is validated
here and handed to the job's processes; an invalid file is refused with one clear line and the running
configuration stays in force. On S3, reads happen on a thread of their own: a slow endpoint never delays a
snapshot. A local file is looked at (without reading it unless it changed) by the sampler's loop itself, at
wake-ups it has anyway: a thread of its own would wake the sampler twice as often. On Linux the kernel also
says when it was written (`file_watch`: the loop waits on that descriptor too), so the loop then looks only
every REREAD_S (for a network file system, where another machine's writes are not told)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from stallwatch.collect.file_watch import FileWatch, open_watch
from stallwatch.config import LIVE_FIELDS, MAX_CONFIG_BYTES, ConfigError, ProfilerConfig
from stallwatch.log import logger
from stallwatch.store import layout
from stallwatch.store.location import FileTooLargeError, UnsafeFileError

POLL_LOCAL_S = 0.5
POLL_REMOTE_S = 2.0
REREAD_S = 10.0  # a local file is read at least this often, whatever its version says


class ConfigWatcher:
    """`take()` (sampler loop) returns the new running configuration once after each accepted change."""

    def __init__(self, location: Any, running: ProfilerConfig, poll_s: float | None = None,
                 background: bool | None = None) -> None:
        self._location = location
        self.running = running
        self.poll_s = poll_s if poll_s is not None else (POLL_REMOTE_S if location.remote else POLL_LOCAL_S)
        self.background = location.remote if background is None else background  # else the owner calls poll()
        self._last_version: tuple[int, ...] | None = None
        self._read_at = 0.0
        self._last_text: bytes | None = None
        self._last_valid: ProfilerConfig | None = None  # the file's last valid content: edits are told from it
        self._accepted: ProfilerConfig | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: FileWatch | None = None
        root = getattr(location, "root", None)
        if not self.background and not location.remote and isinstance(root, str):
            self._watch = open_watch(root, layout.CONFIG_JSON)
            if self._watch is not None and poll_s is None:
                self.poll_s = REREAD_S  # told of each write: looking is only the network file system's fallback
        if self.background:
            self._thread = threading.Thread(target=self._run, name="stallwatch-config", daemon=True)
            self._thread.start()

    def take(self) -> ProfilerConfig | None:
        with self._lock:
            accepted, self._accepted = self._accepted, None
        return accepted

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        if self._watch is not None:
            self._watch.close()

    def fds(self) -> list[int]:
        """What the owner's loop waits on besides its own: readable once config.json was written (none without a
        watch)."""
        return [] if self._watch is None else [self._watch.fileno()]

    def notified(self, ready: list[int]) -> None:
        """The owner's loop woke with `ready` descriptors: read the file now if the watch says it was written."""
        if self._watch is not None and self._watch.fileno() in ready and self._watch.changed():
            self._last_version = None
            self.poll()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        """One look at the file, every `poll_s`: read only when its version changed (or REREAD_S passed)."""
        try:
            version = self._location.version(layout.CONFIG_JSON)
            now = time.monotonic()
            if version is not None and version == self._last_version and now - self._read_at < REREAD_S:
                return
            self._last_version, self._read_at = version, now
            self.check()
        except Exception as exc:  # the watch must outlive any one failure
            logger.debug("config watch: %s", exc)

    def check(self) -> None:
        try:
            text = self._location.read(layout.CONFIG_JSON, MAX_CONFIG_BYTES)
        except (UnsafeFileError, FileTooLargeError) as exc:
            if self._last_text != str(exc).encode():
                self._last_text = str(exc).encode()
                self._refuse(str(exc))
            return
        except Exception:
            return  # not there (yet), or unreachable now: the running configuration stays
        if text == self._last_text:
            return
        self._last_text = text
        proposed = self._validate(text)
        if proposed is None:
            return
        previous, self._last_valid = self._last_valid, proposed
        if previous is not None:  # an edit of the file (the first read is what the run started with)
            fixed = [f for f in proposed.to_dict() if f not in LIVE_FIELDS
                     and getattr(proposed, f) != getattr(previous, f)]
            if fixed:
                logger.warning("config.json: %s cannot change while the job runs (only %s can); ignored",
                               ", ".join(fixed), ", ".join(LIVE_FIELDS))
        changes = {f: getattr(proposed, f) for f in LIVE_FIELDS if getattr(proposed, f) != getattr(self.running, f)}
        if not changes:
            return
        updated = self.running.replace(**changes)
        self.running = updated
        with self._lock:
            self._accepted = updated
        logger.warning("live configuration changed: %s", ", ".join(
            f"{k}={_show(v)}" for k, v in changes.items()))

    def _validate(self, text: bytes) -> ProfilerConfig | None:
        try:
            return ProfilerConfig.from_json_bytes(text, layout.CONFIG_JSON)
        except ConfigError as exc:
            problem = str(exc)
        except Exception as exc:  # nothing in the file may end the watch, or pass unsaid
            problem = f"{type(exc).__name__}: {exc}"
        self._refuse(problem)
        return None

    def _refuse(self, problem: str) -> None:
        logger.warning("the run's config.json change is refused: %s; the running configuration "
                       "stays in force (fix the file, or use `stallwatch config RUN`)", problem)


def _show(value: Any) -> str:
    return value.to_spec() if hasattr(value, "to_spec") else json.dumps(value)
