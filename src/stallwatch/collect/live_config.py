"""The sampler's watch on the run's config.json: a change to a live field (profiling windows) is validated
here and handed to the job's processes; an invalid file is refused with one clear line and the running
configuration stays in force. Reads happen on a thread of their own: a slow S3 endpoint never delays a
snapshot."""

from __future__ import annotations

import json
import threading
from typing import Any

from stallwatch.config import LIVE_FIELDS, ConfigError, ProfilerConfig
from stallwatch.log import logger
from stallwatch.store import layout

POLL_LOCAL_S = 0.5
POLL_REMOTE_S = 2.0


class ConfigWatcher:
    """`take()` (sampler loop) returns the new running configuration once after each accepted change."""

    def __init__(self, location: Any, running: ProfilerConfig, poll_s: float | None = None) -> None:
        self._location = location
        self.running = running
        self._poll_s = poll_s if poll_s is not None else (POLL_REMOTE_S if location.remote else POLL_LOCAL_S)
        self._last_text: bytes | None = None
        self._accepted: ProfilerConfig | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stallwatch-config", daemon=True)
        self._thread.start()

    def take(self) -> ProfilerConfig | None:
        with self._lock:
            accepted, self._accepted = self._accepted, None
        return accepted

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.check()
            except Exception as exc:  # the watch must outlive any one failure
                logger.debug("config watch: %s", exc)

    def check(self) -> None:
        try:
            text = self._location.read(layout.CONFIG_JSON)
        except Exception:
            return  # not there (yet), or unreachable now: the running configuration stays
        if text == self._last_text:
            return
        first = self._last_text is None
        self._last_text = text
        proposed = self._validate(text)
        if proposed is None:
            return
        changes = {f: getattr(proposed, f) for f in LIVE_FIELDS if getattr(proposed, f) != getattr(self.running, f)}
        fixed = [f for f in proposed.to_dict() if f not in LIVE_FIELDS
                 and getattr(proposed, f) != getattr(self.running, f) and f not in ("out", "node", "runs_dir")]
        if fixed and not first:
            logger.warning("config.json: %s cannot change while the job runs (only %s can); ignored",
                           ", ".join(fixed), ", ".join(LIVE_FIELDS))
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
            return ProfilerConfig.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            problem = f"is not valid JSON ({exc.msg} at line {exc.lineno})"
        except (ConfigError, TypeError) as exc:
            problem = str(exc)
        logger.warning("the run's config.json change is refused: %s; the running configuration "
                       "stays in force (fix the file, or use `stallwatch config RUN`)", problem)
        return None


def _show(value: Any) -> str:
    return value.to_spec() if hasattr(value, "to_spec") else json.dumps(value)
