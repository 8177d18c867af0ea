"""What the data loader is set up to do (workers, pinning, prefetching, batch size, worker pids) and, during
data-loader profiling windows, how long each batch took to fetch in which worker.

The window switch is one byte of shared memory made before any worker is forked, so a worker sees it flip
without any message; workers started by `spawn`/`forkserver` do not share it and are not timed (said once)."""

from __future__ import annotations

import json
import mmap
import os
import sys
import time
from typing import Any, Callable

from stallwatch.log import warn_once

FETCH = "fetch"
_flag = mmap.mmap(-1, 1)  # MAP_SHARED and anonymous: inherited by forked workers


def set_profiling(on: bool) -> None:
    _flag[0] = 1 if on else 0


def profiling() -> bool:
    return _flag[0] == 1


_SKIPPED: tuple[str, ...] = ()  # torch's data package and stallwatch's, as directory prefixes (made at first use)
MAX_FRAMES = 30  # frames looked through for the code that built a loader


def creation_site(loader: Any) -> str | None:
    """Where the job built this loader ("file:line"): the first caller outside torch's data package, stallwatch and
    the loader's own (a DataLoader subclass's) `__init__`. Called once per loader, from its `__init__`."""
    global _SKIPPED
    if not _SKIPPED:
        import torch.utils.data

        _SKIPPED = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                         for m in (torch.utils.data, sys.modules["stallwatch"]) if m.__file__)
    frame = sys._getframe(1)
    for _ in range(MAX_FRAMES):
        if frame is None:
            return None
        path = frame.f_code.co_filename
        if not path.startswith(_SKIPPED) and frame.f_locals.get("self") is not loader:
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def describe(it: Any, loader: Any, key: int | None = None) -> dict[str, Any]:
    """The settings the Dataloader rule and the report look at, and the workers' pids; `key` is the loader's own
    number in this process (its data waits name it), `created_at` where the job built it."""
    workers = getattr(it, "_workers", None) or []
    context = getattr(loader, "multiprocessing_context", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    method = getattr(context, "_name", None) if context is not None else _default_start_method()
    if loader.num_workers and method not in (None, "fork"):
        warn_once("dataloader-spawn", "data-loader workers started by %s are not timed by data-loader "
                  "profiling (only fork shares the window switch)", method)
    return {
        "loader_id": id(loader),
        "key": key,
        "created_at": getattr(loader, "_stallwatch_origin", None),
        "dataset": type(loader.dataset).__name__,
        "batch_size": loader.batch_size if loader.batch_size is not None
        else getattr(batch_sampler, "batch_size", None),
        "num_workers": loader.num_workers,
        "pin_memory": bool(loader.pin_memory),
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": bool(loader.persistent_workers),
        "drop_last": bool(loader.drop_last),
        "timeout": loader.timeout,
        "sampler": type(loader.sampler).__name__,
        "multiprocessing_context": method,
        "worker_pids": [w.pid for w in workers],
    }


def patch_fetchers(emit_main: Callable[[tuple], None]) -> list[Callable[[], None]]:
    """Time each batch fetch while a window is open, in whichever process fetches it; returns the undos."""
    from torch.utils.data._utils import fetch as tfetch

    undo = []
    for cls in (tfetch._MapDatasetFetcher, tfetch._IterableDatasetFetcher):
        original = cls.__dict__["fetch"]
        cls.fetch = _timed_fetch(original, emit_main)
        undo.append(lambda cls=cls, original=original: setattr(cls, "fetch", original))
    return undo


def _timed_fetch(original: Callable[..., Any], emit_main: Callable[[tuple], None]) -> Callable[..., Any]:
    main_pid = os.getpid()

    def fetch(self, possibly_batched_index):
        if _flag[0] == 0:
            return original(self, possibly_batched_index)
        t0 = time.time_ns() // 1000
        try:
            return original(self, possibly_batched_index)
        finally:
            try:
                _record(t0, possibly_batched_index, main_pid, emit_main)
            except Exception as exc:
                warn_once(f"fetch-{type(exc).__name__}", "timing a batch fetch failed (%s)", exc)
    fetch.__stallwatch_original__ = original  # type: ignore[attr-defined]
    return fetch


def _record(t0: int, index: Any, main_pid: int, emit_main: Callable[[tuple], None]) -> None:
    t1 = time.time_ns() // 1000
    pid = os.getpid()
    size = len(index) if hasattr(index, "__len__") else 1
    if pid == main_pid:
        emit_main((FETCH, "main", t0, t1, "GLOBAL", None, pid, json.dumps({"worker": None, "samples": size})))
        return
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    worker = info.id if info is not None else None
    sender = _worker_sender()
    if sender is not None:
        sender.emit_tuple((FETCH, f"worker{worker}", t0, t1, "GLOBAL", None, pid,
                           json.dumps({"worker": worker, "samples": size})))
        sender.wake()


_worker: dict[str, Any] = {}


def _worker_sender():
    """A worker's own sender, flushed when the worker exits (multiprocessing skips atexit there)."""
    if _worker.get("pid") != os.getpid():
        from multiprocessing import util

        from stallwatch.collect.events import sender_from_env

        sender = sender_from_env()
        _worker.update(pid=os.getpid(), sender=sender)
        if sender is not None:
            util.Finalize(sender, sender.close, exitpriority=10)
    return _worker["sender"]


def _default_start_method() -> str | None:
    import multiprocessing

    try:
        return multiprocessing.get_context().get_start_method()  # the default, without fixing it
    except Exception:
        return None
