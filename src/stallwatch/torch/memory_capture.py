"""Where memory grows: a `memory` profiling window (asked for by MemoryGrowth's escalation, or configured as
`memory_profiling`) traces the job's Python allocations with tracemalloc, snapshots them `STEPS` steps apart and
keeps the sites that grew most — each as the job's own line that allocated (the innermost frame outside PyTorch,
the standard library and stallwatch) with its traceback. On CUDA it also records the caching allocator's history
for those steps (`torch.cuda.memory._record_memory_history`) and keeps its snapshot, which PyTorch's memory viewer
(pytorch.org/memory_viz) opens. The sites go into the run as a `memory_sites` event (the rule reads them) and a
file of the window."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from stallwatch.log import warn_once

STEPS = 5  # the snapshots are this many steps apart
NFRAMES = 8  # frames tracemalloc keeps per allocation (its cost per allocation grows with them)
TENSOR_FRAMES = 64  # frames kept per tensor made (a walk up the stack: the job's line may be deep in a model)
MAX_CAPTURE_S = 5.0  # a capture whose steps run this long ends at the next boundary with what it has
TOP = 10  # sites kept
CUDA_ENTRIES = 100_000  # allocator history entries kept (PyTorch's ring buffer)
MEMORY_SITES = "memory_sites"
CUDA_SNAPSHOT = "cuda_memory_snapshot"


_STALLWATCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _library_roots() -> tuple[str, ...]:
    """Paths whose frames are not the job's own: the standard library, installed packages, stallwatch."""
    roots = {_STALLWATCH}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.update((os.path.realpath(path) + os.sep, path + os.sep))
    return tuple(sorted(roots))


def _stdlib_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The standard library's roots, and the installed packages' (often inside it: lib/python3.11/site-packages)."""
    def roots(*keys: str) -> tuple[str, ...]:
        paths = (sysconfig.get_paths().get(k) for k in keys)
        return tuple(sorted({r for p in paths if p for r in (os.path.realpath(p) + os.sep, p + os.sep)}))
    return roots("stdlib", "platstdlib"), roots("purelib", "platlib")


def _is_stdlib(filename: str, stdlib: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    return filename.startswith(stdlib[0]) and not filename.startswith(stdlib[1])


class MemoryCapture:
    """A window's profiler (torch/windows.py): start → one snapshot at the next step boundary, another `STEPS`
    steps later (`done` then), stop → the diff. Its own time in the training thread is measured (`cost_ms`)."""

    def __init__(self, emit: Callable[[tuple], None], pid: int) -> None:
        self._emit = emit
        self._pid = pid
        self.meta: dict[str, Any] = {"profiler": "tracemalloc", "steps_apart": STEPS}
        self.done = False
        self._ours = False
        self._first: tracemalloc.Snapshot | None = None
        self._last: tracemalloc.Snapshot | None = None
        self._steps = [-1, -1]
        self._seen = 0
        self._step0 = 0
        self._cost_ns = 0
        self._cuda = False
        self._tensors: list[dict[str, Any]] = []
        self._mode: Any = None
        self._started = 0.0

    def start(self, first_step: int) -> None:
        t0 = time.perf_counter_ns()
        self._started = time.monotonic()
        self._step0 = first_step
        if not tracemalloc.is_tracing():
            tracemalloc.start(NFRAMES)
            self._ours = True
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                torch.cuda.memory._record_memory_history(max_entries=CUDA_ENTRIES)
                self._cuda = True
        except Exception:  # an allocator without history (a custom one): the host sites stay
            self._cuda = False
        self._cost_ns += time.perf_counter_ns() - t0

    def next_step(self) -> None:
        """A step begins inside the window: the first full step starts the diff, `STEPS` later ends it (or
        earlier, once MAX_CAPTURE_S have passed: tracing slows a job that allocates many Python objects)."""
        self._seen += 1
        if self._seen == 1:
            self._first = self._snapshot()
            self._steps[0] = self._step0 + 1
            self._track_tensors()
            return
        late = time.monotonic() - self._started > MAX_CAPTURE_S
        if self._seen == STEPS and self._mode is not None and not late:
            self._mode.on = False  # what the last step makes is its own state (its grads, its batch), not kept
        elif self._seen >= 1 + STEPS or late:
            self._last = self._snapshot()
            self._steps[1] = self._step0 + self._seen - 1
            t0 = time.perf_counter_ns()
            self._end_tracking()
            self._cost_ns += time.perf_counter_ns() - t0
            self.done = True

    def _track_tensors(self) -> None:
        """From the first full step: which torch call made each tensor (only when no other mode is active: ours
        must be the one popped at the end)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            if torch._C._len_torch_function_stack() == 0:
                self._mode = _tensor_tracker()
                self._mode.__enter__()
        except Exception:
            self._mode = None

    def _end_tracking(self) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        mode.on = False
        try:
            from torch.overrides import _get_current_function_mode

            if _get_current_function_mode() is mode:
                mode.__exit__(None, None, None)
            else:  # another mode was pushed over ours: ours stays, switched off (it passes calls through)
                warn_once("memory-capture-mode", "a TorchFunctionMode was entered during the memory capture; "
                          "stallwatch's stays under it, switched off")
            self._tensors = tensor_sites(mode.made)
        except Exception as exc:
            warn_once("memory-capture-tensors", "the memory capture could not list tensors (%s: %s)",
                      type(exc).__name__, exc)
        mode.made.clear()

    def _snapshot(self) -> tracemalloc.Snapshot | None:
        t0 = time.perf_counter_ns()
        try:
            return tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
        finally:
            self._cost_ns += time.perf_counter_ns() - t0

    def stop(self, folder: str) -> dict[str, str]:
        t0 = time.perf_counter_ns()
        files: dict[str, str] = {}
        try:
            if self._last is None and self._first is not None:
                self._last = self._snapshot()
                self._steps[1] = self._step0 + max(self._seen - 1, 1)
            self._end_tracking()
            if self._cuda:
                files.update(self._cuda_snapshot(folder))
        finally:
            if self._ours:
                tracemalloc.stop()
        sites, grown = top_sites(self._first, self._last) if self._first and self._last else ([], 0.0)
        sites = (self._tensors + sites)[:TOP]
        self._first = self._last = None
        self._cost_ns += time.perf_counter_ns() - t0
        record = {"steps": self._steps, "grown_kb": round(grown, 3), "cost_ms": round(self._cost_ns / 1e6, 3),
                  "sites": sites, "nframes": NFRAMES}
        self.meta = {**self.meta, "cost_ms": record["cost_ms"]}
        if folder:
            path = os.path.join(folder, "memory_sites.json")
            with open(path, "w") as fh:
                json.dump(record, fh)
            files["memory_sites.json"] = path
        t = time.time_ns() // 1000
        self._emit((MEMORY_SITES, "tracemalloc", t, t, "GLOBAL", None, self._pid, json.dumps(record)))
        if "cuda_memory.pickle" in files:
            self._emit((CUDA_SNAPSHOT, "cuda", t, t, "GLOBAL", None, self._pid,
                        json.dumps({"path": os.path.basename(folder) + "/cuda_memory.pickle"})))
        return files

    def _cuda_snapshot(self, folder: str) -> dict[str, str]:
        import torch

        try:
            if not folder:
                return {}
            path = os.path.join(folder, "cuda_memory.pickle")
            torch.cuda.memory._dump_snapshot(path)
            return {"cuda_memory.pickle": path}
        except Exception:
            return {}
        finally:
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass


def _own_frame(frames: list[Any], roots: tuple[str, ...], stdlib: tuple[tuple[str, ...], tuple[str, ...]]) -> tuple[Any, bool] | None:
    """The frame that names an allocation: the job's innermost one, else the innermost; None when the allocation
    is stallwatch's own (its innermost frame outside the standard library is in stallwatch)."""
    inner = next((f for f in reversed(frames) if not _is_stdlib(f.filename, stdlib)), frames[-1])
    if inner.filename.startswith(_STALLWATCH):
        return None
    own = next((f for f in reversed(frames) if not f.filename.startswith(roots) and not f.filename.startswith("<")),
               None)
    return (own, True) if own is not None else (frames[-1], False)


MAX_TRACKED = 200_000  # tensors remembered during a capture (a step making more keeps its first ones)


def _tensor_tracker() -> Any:
    """A TorchFunctionMode that remembers, for each tensor a torch function returns during the capture, a weak
    reference and the Python stack that made it (tracemalloc does not see tensors: PyTorch allocates their memory
    and their objects itself)."""
    import weakref

    import torch
    from torch.overrides import TorchFunctionMode

    tensor = torch.Tensor

    class _Made(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.made: dict[int, tuple[Any, list[tuple[str, int]]]] = {}
            self.on = True

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))  # raises as it would without us
            # an in-place op returns its input (a parameter updated by the optimizer): not made here
            if self.on and isinstance(out, tensor) and len(self.made) < MAX_TRACKED \
                    and not any(a is out for a in args):
                try:
                    f, frames = sys._getframe(1), []
                    while f is not None and len(frames) < TENSOR_FRAMES:
                        frames.append((f.f_code.co_filename, f.f_lineno))
                        f = f.f_back
                    self.made[id(out)] = (weakref.ref(out), frames[::-1])
                except TypeError:  # a tensor subclass without weak references
                    pass
            return out

    return _Made()


def tensor_sites(made: dict[int, tuple[Any, list[tuple[str, int]]]],
                 roots: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The tensors made during the capture's first steps and still alive a step later (kept across steps), by the
    job's line that made them, with their storage's bytes (each storage once)."""
    roots = roots if roots is not None else _library_roots()
    stdlib = _stdlib_roots()
    storages: set[int] = set()
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    for ref, stack in list(made.values()):
        obj = ref()
        if obj is None:
            continue
        try:
            storage = obj.untyped_storage()
            ptr, nbytes, device = storage.data_ptr(), storage.nbytes(), str(obj.device)
        except Exception:
            continue
        if ptr and ptr in storages:
            continue
        storages.add(ptr)
        frames = [_Frame(f, n) for f, n in stack]
        named = _own_frame(frames, roots, stdlib)
        if named is None or not frames:
            continue
        frame, own = named
        g = groups.setdefault((frame.filename, frame.lineno), {"size": 0, "count": 0, "own": own, "devices": set(),
                                                               "frames": frames})
        g["size"] += nbytes
        g["count"] += 1
        g["devices"].add(device)
    ranked = sorted(groups.items(), key=lambda kv: (not kv[1]["own"], -kv[1]["size"]))
    return [{"file": filename, "line": line, "size_kb": round(g["size"] / 1024, 3), "count": g["count"],
             "own": g["own"], "kind": "tensors", "devices": sorted(g["devices"]),
             "traceback": [f"{f.filename}:{f.lineno}" for f in g["frames"]]} for (filename, line), g in ranked[:TOP]]


class _Frame:
    __slots__ = ("filename", "lineno")

    def __init__(self, filename: str, lineno: int) -> None:
        self.filename, self.lineno = filename, lineno


def top_sites(first: tracemalloc.Snapshot, last: tracemalloc.Snapshot,
              roots: tuple[str, ...] | None = None) -> tuple[list[dict[str, Any]], float]:
    """The sites that grew most between two snapshots, each named by the job's own innermost line, and the traced
    heap's growth (KiB). Allocations whose every frame is a library's are grouped under their innermost frame."""
    roots = roots if roots is not None else _library_roots()
    stdlib = _stdlib_roots()
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    grown = 0
    for stat in last.compare_to(first, "traceback"):
        grown += stat.size_diff
        if stat.size_diff <= 0:
            continue
        frames = list(stat.traceback)  # oldest first
        named = _own_frame(frames, roots, stdlib)
        if named is None:  # stallwatch's own (its events, this capture): not the job's
            continue
        where, own = named
        g = groups.setdefault((where.filename, where.lineno),
                              {"size": 0, "count": 0, "frames": frames, "best": 0, "own": own})
        g["size"] += stat.size_diff
        g["count"] += stat.count_diff
        if stat.size_diff > g["best"]:
            g["frames"], g["best"] = frames, stat.size_diff
    # the job's own lines first (what it can change), then the libraries' own allocations
    ranked = sorted(groups.items(), key=lambda kv: (not kv[1]["own"], -kv[1]["size"]))
    out = [{"file": filename, "line": line, "size_kb": round(g["size"] / 1024, 3), "count": g["count"],
            "own": g["own"], "kind": "heap", "traceback": [f"{f.filename}:{f.lineno}" for f in g["frames"]]}
           for (filename, line), g in ranked[:TOP]]
    return out, grown / 1024
