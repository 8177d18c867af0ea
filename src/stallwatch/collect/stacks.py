"""The Python stacks of every thread of a job's process, read inside it on stallwatch's sender thread when the
sampler asks (`{"stacks": N}`, after the run's `dump_stacks` was raised): no signal handler is installed (the
job's signals stay its own) and the training thread is never interrupted. What the Hang rule shows for a rank
that stopped. Bounded: at most MAX_THREADS threads, the innermost MAX_FRAMES frames of each, MAX_BYTES in all."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

MAX_THREADS = 64
MAX_FRAMES = 64
MAX_CODE_CHARS = 200
MAX_BYTES = 256 * 1024  # a socket line holds 1 MiB (event_server.MAX_LINE_BYTES)


@dataclass(frozen=True)
class StackDump:
    """A process's stacks as the sampler received them: who sent them (its hello) and what it sent."""

    identity: dict[str, int]
    dump: dict[str, Any]


def snapshot(request: int) -> dict[str, Any]:
    """Every thread of this process but the calling one (stallwatch's own sender), the main thread first:
    name, whether it is the main thread or a daemon, and its frames outermost first."""
    me = threading.get_ident()
    known = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        thread = known.get(ident)
        depth, f = 0, frame
        while f is not None:
            depth += 1
            f = f.f_back
        frames = traceback.extract_stack(frame, limit=MAX_FRAMES)
        threads.append({
            "id": ident, "name": thread.name if thread is not None else f"thread {ident}",
            "main": ident == main, "daemon": bool(thread.daemon) if thread is not None else None,
            "frames": [{"file": s.filename, "line": s.lineno, "function": s.name,
                        "code": (s.line or "")[:MAX_CODE_CHARS]} for s in frames],
            "frames_left_out": max(0, depth - len(frames)),
        })
    threads.sort(key=lambda t: (not t["main"], str(t["name"])))
    left_out = max(0, len(threads) - MAX_THREADS)
    threads = threads[:MAX_THREADS]
    dump = {"request": int(request), "at_us": time.time_ns() // 1000, "pid": os.getpid(), "threads": threads,
            "threads_left_out": left_out}
    while len(threads) > 1 and len(json.dumps(dump)) > MAX_BYTES:  # the main thread stays
        threads.pop()
        dump["threads_left_out"] += 1
    if len(json.dumps(dump)) > MAX_BYTES and threads:
        threads[0]["frames"] = threads[0]["frames"][-8:]
    return dump
