"""Each step's memory, read in the training thread at the step's end so that memory can be judged against steps
(MemoryGrowth): the process's resident set from /proc/self/statm (one pread of a kept fd, ~2 µs) every step, and
on CUDA the caching allocator's allocated / reserved / peak at most every `CUDA_EVERY_US` (its statistics call
builds a dict of a few hundred entries: tens of µs). Stored in the step's args (docs/format.md, `rss_kb`)."""

from __future__ import annotations

import os
import sys

from stallwatch.fds import KeptFile

STATM = "/proc/self/statm"  # size resident shared text lib data dt, in pages
CUDA_EVERY_US = 200_000  # the allocator's statistics at most this often (a step longer than this has them each)
_PAGE_KB = (os.sysconf("SC_PAGE_SIZE") // 1024) if hasattr(os, "sysconf") else 4


class StepMemory:
    """`read(end_us)` → the memory fields of a step's args (`"rss_kb": N` …), "" where nothing can be read. The
    statm fd is kept open and reopened in a forked child (whose /proc/self is another process)."""

    __slots__ = ("_cuda_next", "_cuda_state", "_statm", "limits")

    def __init__(self) -> None:
        self._statm = KeptFile(STATM)
        self._cuda_next = 0
        self._cuda_state = 0  # 0: not looked at yet; 1: CUDA in use; -1: none (looked again every CUDA_EVERY_US)
        # (kind, name, args) markers to emit once: the memory limits the job runs under (cgroup, GPU)
        self.limits: list[tuple[str, str]] = []

    def read(self, end_us: int) -> str:
        statm = self._statm
        if statm.stale():
            self._open()
        out = ""
        data = statm.read(96)
        if data is not None:
            try:
                out = f'"rss_kb": {int(data.split()[1]) * _PAGE_KB}'
            except (ValueError, IndexError):
                out = ""
        if end_us >= self._cuda_next:
            self._cuda_next = end_us + CUDA_EVERY_US
            cuda = self._cuda()
            if cuda:
                out = f"{out}, {cuda}" if out else cuda
        return out

    def _cuda(self) -> str:
        """The caching allocator's figures of the current device, once CUDA is initialized (never initializes it)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return ""
        try:
            if not torch.cuda.is_initialized():
                return ""
            device = torch.cuda.current_device()
            stats = torch.cuda.memory_stats_as_nested_dict(device)
            alloc, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
            if self._cuda_state != 1:
                self._cuda_state = 1
                total = torch.cuda.get_device_properties(device).total_memory
                self.limits.append(("gpu", f'{{"bytes": {int(total)}, "device": {int(device)}}}'))
                attach_oom_observer(torch)
            return (f'"cuda_alloc_kb": {alloc["current"] // 1024}, "cuda_reserved_kb": {reserved["current"] // 1024}, '
                    f'"cuda_peak_kb": {alloc["peak"] // 1024}')
        except Exception:  # no CUDA build, a driver gone: the host figures stay
            self._cuda_state = -1
            return ""

    def _open(self) -> None:
        self._statm.open()
        limit = cgroup_memory_limit()
        if limit is not None:
            self.limits.append(("cgroup", f'{{"bytes": {limit}}}'))

    def close(self) -> None:
        self._statm.close()


# What the CUDA allocator said at its last failed allocation, at that moment (before the exception is raised):
# the `oom` event recorded at exit carries it (torch/oom.py)
CUDA_FAILURE: dict[str, int] = {}
_observing = False


def attach_oom_observer(torch: object) -> None:
    """Once per process: PyTorch calls the observer when an allocation fails, before OutOfMemoryError is raised."""
    global _observing
    attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
    if _observing or attach is None:
        return
    _observing = True

    def observed(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        CUDA_FAILURE.update(device=int(device), tried_kb=int(alloc) // 1024,
                            allocated_kb=int(device_allocated) // 1024, free_kb=int(device_free) // 1024)

    try:
        attach(observed)
    except Exception:  # an allocator without observers: the state read at exit stays
        pass


UNLIMITED = 1 << 60  # v1 writes "no limit" as a page-rounded 2^63


def cgroup_memory_limit(pid: int | str = "self", root: str = "/sys/fs/cgroup", proc: str = "/proc") -> int | None:
    """The tightest memory limit (bytes) of the process's cgroup and its ancestors: v2 `memory.max`, v1
    `memory.limit_in_bytes`; None when unlimited or unreadable."""
    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as fh:
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    found: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "" and os.path.exists(os.path.join(root, "cgroup.controllers")):
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = os.path.join(root, "memory"), "memory.limit_in_bytes"
        else:
            continue
        rel = path.strip("/")
        while True:
            value = _read_limit(os.path.join(base, rel, name) if rel else os.path.join(base, name))
            if value is not None:
                found.append(value)
            if not rel:
                break
            rel = os.path.dirname(rel)
    return min(found) if found else None


def _read_limit(path: str) -> int | None:
    try:
        with open(path, "rb") as fh:
            text = fh.read(64).strip()
    except OSError:
        return None
    if not text or text == b"max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < UNLIMITED else None
