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
from stallwatch.store import layout
from stallwatch.store.location import RunLocation

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


class SpoolingSink:
    """Same `write_atomic`/`create_exclusive`/`delete` as a RunLocation; the remote side catches up in the
    background, strictly in the order the calls were made."""

    def __init__(self, remote: RunLocation, spool_dir: Path) -> None:
        self.remote = remote
        self.spool = RunLocation(str(spool_dir))
        # ("put" | "create" | "delete", rel path), applied in order; the head is the one being uploaded.
        self._ops: deque[tuple[str, str]] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._stopped = False  # close() gave up: the uploader ends after its current attempt
        self._wake = False  # cut a back-off wait short (close() wants a last try now)
        self._failing_since: float | None = None
        self.uploaded = 0
        self._thread = threading.Thread(target=self._run, name="stallwatch-upload", daemon=True)
        self._thread.start()

    def write_atomic(self, rel: str, data: bytes) -> None:
        self._enqueue("put", rel, data)

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Upload `rel` unless the remote store has it by then (checked when it is uploaded, so the answer is
        not known yet: returns True once it is queued)."""
        self._enqueue("create", rel, data)
        return True

    def _enqueue(self, op: str, rel: str, data: bytes) -> None:
        self.spool.write_atomic(rel, data)
        with self._cond:
            if op == "put" and rel.startswith(f"{layout.LIVE_DIR}/") and (op, rel) in list(self._ops)[1:]:
                return  # the live counts, rewritten while a slow store is behind: the queued put sends the newest
            self._ops.append((op, rel))
            self._cond.notify_all()

    def delete(self, rel: str) -> None:
        with self._cond:
            head = self._ops[0] if self._ops else None
            queued = [o for o in list(self._ops)[1:] if o[1] == rel and o[0] != "delete"]
            for o in queued:  # never uploaded: nothing to upload, nothing to delete remotely
                self._ops.remove(o)
            if head is not None and head[1] == rel and head[0] != "delete":
                self._ops.append(("delete", rel))  # being uploaded now: delete it remotely afterwards
            elif queued:
                self.spool.delete(rel)
            else:
                self._ops.append(("delete", rel))
            self._cond.notify_all()

    @property
    def backlog(self) -> int:
        with self._cond:
            return len(self._ops)

    def close(self, timeout_s: float) -> bool:
        """Upload what is left within `timeout_s`; True when everything reached the remote store. On False
        the rest stays in the spool directory (one line says where) and the uploader stops."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closing = True
            self._wake = True  # the endpoint may be back: retry now rather than after a long back-off
            self._cond.notify_all()
            while self._ops and not self._stopped and time.monotonic() < deadline:
                self._cond.wait(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
            left = len(self._ops)
            if left:
                self._stopped = True
                self._cond.notify_all()
        if left:
            logger.warning("%d file(s) could not be uploaded to %s in time; they are kept in %s "
                           "(send them later with: stallwatch upload %s %s)",
                           left, self.remote.uri, self.spool.root, self.spool.root, self.remote.uri)
            return False
        self._thread.join(timeout=1.0)
        self._remove_empty_spool()
        return True

    def _run(self) -> None:
        delay = BACKOFF_START_S
        while True:
            with self._cond:
                while not self._ops and not self._stopped:
                    if self._closing:
                        return
                    self._cond.wait(timeout=1.0)
                if self._stopped:
                    return
                op, rel = self._ops[0]
            try:
                data = self.spool.read(rel) if op != "delete" else b""
            except FileNotFoundError:
                data = None  # the spool copy vanished (cancelled): nothing to upload
            try:
                if data is None:
                    pass
                elif op == "put":
                    self.remote.write_atomic(rel, data)
                elif op == "create":
                    if not self.remote.create_exclusive(rel, data):
                        logger.debug("%s/%s exists already; left as it is", self.remote.uri, rel)
                else:
                    self.remote.delete(rel)
            except Exception as exc:
                if self._stopped:  # close() gave up during this try and has said where the files are
                    return
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    logger.warning("cannot reach %s (%s); keeping data in %s and retrying",
                                   self.remote.uri, _short(exc), self.spool.root)
                with self._cond:
                    if not self._wake and not self._stopped:
                        self._cond.wait(timeout=delay * (0.5 + random.random()))
                    self._wake = False
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
                    if op != "delete" and not any(o[1] == rel and o[0] != "delete" for o in self._ops):
                        try:
                            self.spool.delete(rel)
                        except OSError:
                            pass
                    self.uploaded += op != "delete" and data is not None
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
