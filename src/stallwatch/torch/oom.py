"""An out-of-memory death, explained: when the job ends on an uncaught allocation failure — a host `MemoryError`, the
CPU allocator's "can't allocate memory", CUDA's `OutOfMemoryError` — the memory state is recorded in the run as an
`oom` event (docs/format.md) at exit, before the process is gone. Read from `sys.last_value`, which Python sets for
the uncaught exception before the exit handlers run: no hook is installed, the exception is neither caught nor
changed, and the job's own `sys.excepthook` stays its own."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import tracemalloc
from typing import Any

from stallwatch.torch.memory import CUDA_FAILURE, cgroup_memory_limit

OOM = "oom"
HOST, CUDA = "host", "cuda"
_HOST_TEXTS = ("can't allocate memory", "cannot allocate memory", "unable to allocate", "out of memory")
MAX_ERROR_CHARS = 500
TOP_SITES = 5


def allocation_failure(exc: BaseException | None) -> str | None:
    """"cuda" or "host" when `exc` (or what it was raised from) is an allocation failure; None otherwise."""
    seen = 0
    while exc is not None and seen < 4:
        torch = sys.modules.get("torch")
        cuda_oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
        if cuda_oom is not None and isinstance(exc, cuda_oom):
            return CUDA
        if isinstance(exc, MemoryError):
            return HOST
        if isinstance(exc, RuntimeError):
            text = str(exc)[:4000].lower()
            if "cuda out of memory" in text or "cuda error: out of memory" in text:
                return CUDA
            if any(t in text for t in _HOST_TEXTS):
                return HOST
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def memory_state(kind: str, exc: BaseException, step: int | None) -> dict[str, Any]:
    """What memory looked like at the failure: the process's resident set and address space, its limits (address
    space, cgroup), on CUDA the allocator's figures, and tracemalloc's top lines when it is tracing."""
    out: dict[str, Any] = {"error": f"{type(exc).__name__}: {str(exc)[:MAX_ERROR_CHARS]}", "train_steps": step}
    try:
        with open("/proc/self/statm", "rb") as fh:
            size, resident = (int(v) for v in fh.read().split()[:2])
        page = os.sysconf("SC_PAGE_SIZE")
        out.update(rss_kb=resident * page // 1024, vm_kb=size * page // 1024)
    except (OSError, ValueError):
        pass
    try:
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            out["rlimit_as_bytes"] = int(soft)
    except (OSError, ValueError):
        pass
    limit = cgroup_memory_limit()
    if limit is not None:
        out["cgroup_limit_bytes"] = limit
    if kind == CUDA:
        out["cuda"] = _cuda_state()
        if CUDA_FAILURE:  # the allocator's own figures at the moment it failed (its OOM observer)
            out["cuda"]["at_failure"] = dict(CUDA_FAILURE)
    if tracemalloc.is_tracing():
        try:
            stats = tracemalloc.take_snapshot().statistics("lineno")[:TOP_SITES]
            out["sites"] = [{"file": s.traceback[0].filename, "line": s.traceback[0].lineno,
                             "size_kb": round(s.size / 1024, 3), "count": s.count} for s in stats]
        except Exception:
            pass
    return out


def _cuda_state() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    try:
        device = torch.cuda.current_device()
        stats = torch.cuda.memory_stats_as_nested_dict(device)
        return {"device": int(device), "allocated_kb": stats["allocated_bytes"]["all"]["current"] // 1024,
                "reserved_kb": stats["reserved_bytes"]["all"]["current"] // 1024,
                "peak_kb": stats["allocated_bytes"]["all"]["peak"] // 1024,
                "total_kb": torch.cuda.get_device_properties(device).total_memory // 1024}
    except Exception as exc:
        return {"unreadable": f"{type(exc).__name__}: {str(exc)[:200]}"}


def record_at_exit(emit: Any, pid: int, step: int | None) -> bool:
    """At exit: when the job is ending on an uncaught allocation failure, its memory state as an `oom` event."""
    exc = getattr(sys, "last_value", None)
    kind = allocation_failure(exc)
    if kind is None or exc is None:
        return False
    t = time.time_ns() // 1000
    emit((OOM, kind, t, t, "GLOBAL", None, pid, json.dumps(memory_state(kind, exc, step))))
    return True
