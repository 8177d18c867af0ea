"""Remote writes that never block: files land in a local spool and a background thread uploads them in
order, retrying with back-off while the endpoint is down or slow."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from pathlib import Path

from stallwatch.log import logger
from stallwatch.store.location import RunLocation

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


class SpoolingSink:
    """Same `write_atomic`/`delete` as a RunLocation; the remote side catches up in the background."""

    def __init__(self, remote: RunLocation, spool_dir: Path) -> None:
        self.remote = remote
        self.spool = RunLocation(str(spool_dir))
        self._ops: deque[tuple[str, str]] = deque()  # ("put" | "delete", rel path), applied in order
        self._cond = threading.Condition()
        self._closing = False
        self._failing_since: float | None = None
        self.uploaded = 0
        self._thread = threading.Thread(target=self._run, name="stallwatch-upload", daemon=True)
        self._thread.start()

    def write_atomic(self, rel: str, data: bytes) -> None:
        self.spool.write_atomic(rel, data)
        with self._cond:
            self._ops.append(("put", rel))
            self._cond.notify()

    def delete(self, rel: str) -> None:
        with self._cond:
            in_flight = bool(self._ops) and self._ops[0] == ("put", rel)
            if not in_flight and ("put", rel) in self._ops:  # never uploaded: nothing to delete remotely
                self._ops.remove(("put", rel))
                self.spool.delete(rel)
                return
            self._ops.append(("delete", rel))
            self._cond.notify()

    @property
    def backlog(self) -> int:
        with self._cond:
            return len(self._ops)

    def close(self, timeout_s: float) -> bool:
        """Upload what is left within `timeout_s`; True when everything reached the remote store."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._ops and time.monotonic() < deadline:
                self._cond.wait(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
            left = len(self._ops)
        if left:
            logger.warning("%d file(s) could not be uploaded to %s in time; they are kept in %s",
                           left, self.remote.uri, self.spool.root)
            return False
        self._remove_empty_spool()
        return True

    def _run(self) -> None:
        delay = BACKOFF_START_S
        while True:
            with self._cond:
                while not self._ops:
                    if self._closing:
                        return
                    self._cond.wait(timeout=1.0)
                op, rel = self._ops[0]
            try:
                if op == "put":
                    data = self.spool.read(rel)
                    self.remote.write_atomic(rel, data)
                else:
                    self.remote.delete(rel)
            except FileNotFoundError:
                pass  # the spool copy vanished (cancelled): nothing to upload
            except Exception as exc:
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    logger.warning("cannot reach %s (%s); keeping data in %s and retrying",
                                   self.remote.uri, _short(exc), self.spool.root)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            if self._failing_since is not None:
                logger.warning("%s is reachable again after %.0f s; uploading the backlog",
                               self.remote.uri, time.monotonic() - self._failing_since)
                self._failing_since = None
            delay = BACKOFF_START_S
            with self._cond:
                if self._ops and self._ops[0] == (op, rel):
                    self._ops.popleft()
                    if op == "put" and ("put", rel) not in self._ops:
                        self.spool.delete(rel)
                    self.uploaded += op == "put"
                self._cond.notify_all()

    def _remove_empty_spool(self) -> None:
        for dirpath, _dirs, _files in sorted(os.walk(self.spool.root), key=lambda t: -len(t[0])):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
