"""What a stopped rank is doing, read from its main thread's Python stack (store.stacks): inside a collective,
in backward (where DDP all-reduces gradients), waiting for data, in forward or the optimizer, or in the loop's
own code — and the job's own line that led there. The innermost frame that says decides; stallwatch's wrappers
and the standard library are looked through."""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass

from stallwatch.store.stacks import Frame, StackDump

COLLECTIVE, BACKWARD, DATA, FORWARD, OPTIMIZER, LOOP_CODE, UNKNOWN = (
    "collective", "backward", "data_wait", "forward", "optimizer", "loop_code", "unknown")
COLLECTIVE_CALLS = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list", "reduce",
    "gather", "scatter", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "gather_object", "scatter_object_list", "all_reduce_coalesced"})
PHASE_WORDS = {COLLECTIVE: "inside a collective", BACKWARD: "in backward (DDP all-reduces gradients there)",
               DATA: "waiting for data", FORWARD: "in forward", OPTIMIZER: "in the optimizer step",
               LOOP_CODE: "in the loop's own code", UNKNOWN: "somewhere not recorded"}
_STDLIB = tuple(p for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if p)


@dataclass(frozen=True)
class Phase:
    """`kind` (one of the names above), `call` (the collective, or the torch function), `where` (the job's own
    innermost line, "file:line in function"), `frame` (the innermost frame of all, as text)."""

    kind: str
    call: str = ""
    where: str = ""
    frame: str = ""

    @property
    def words(self) -> str:
        text = PHASE_WORDS.get(self.kind, self.kind)
        if self.kind == COLLECTIVE and self.call:
            text = f"inside {self.call}"
        return f"{text} (called at {self.where})" if self.where else text


def frame_text(f: Frame) -> str:
    return f"{f.file}:{f.line} in {f.function}"


def _norm(path: str) -> str:
    return path.replace(os.sep, "/")


def _is_library(f: Frame) -> bool:
    path = _norm(f.file)
    return ("/site-packages/" in path or "/dist-packages/" in path or "/stallwatch/" in path
            or path.startswith("<") or any(path.startswith(_norm(p)) for p in _STDLIB))


def _kind_of(f: Frame) -> tuple[str, str] | None:
    path = _norm(f.file)
    if "/torch/distributed/" in path and f.function in COLLECTIVE_CALLS:
        return COLLECTIVE, f.function
    if "/torch/autograd/" in path or (path.endswith("/torch/_tensor.py") and f.function == "backward"):
        return BACKWARD, "backward"
    if "/torch/utils/data/" in path:
        return DATA, f.function
    if "/torch/optim/" in path:
        return OPTIMIZER, f.function
    if path.endswith("/torch/nn/modules/module.py") and f.function in ("_call_impl", "_wrapped_call_impl"):
        return FORWARD, "forward"
    return None


def phase_of(dump: StackDump | None) -> Phase:
    """The phase of the dump's main thread (UNKNOWN without one)."""
    thread = dump.main if dump is not None else None
    if thread is None or not thread.frames:
        return Phase(UNKNOWN)
    frames = thread.frames  # outermost first
    own = next((f for f in reversed(frames) if not _is_library(f)), None)
    where = frame_text(own) if own is not None else ""
    innermost = frame_text(frames[-1])
    for f in reversed(frames):
        found = _kind_of(f)
        if found is not None:
            return Phase(found[0], found[1], where, innermost)
    return Phase(LOOP_CODE, frames[-1].function, where, innermost)
