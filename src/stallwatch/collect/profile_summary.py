"""Small totals computed from raw profiler output, so rules and reports never open a 50 MB trace: per
operator from a torch.profiler Chrome trace, per function from cProfile stats or a pyinstrument tree."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

import numpy as np

# Host-side operators (aten::*, autograd nodes) of torch.profiler's Chrome trace. In torch 2.13 a CPU
# trace also holds `python_function` (with_stack), `user_annotation` (ProfilerStep#N, record_function),
# `fwdbwd` flow arrows and a `Trace` span: those are not operators and are left out, so self time is
# measured against child operators only.
HOST_CATEGORIES = frozenset({"cpu_op"})
# Device-side work; kernels do not nest, so their self time is their duration.
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Timestamps are µs with ns decimals: a child can end a rounding error after its parent.
_NEST_EPS_US = 0.01


def operator_rows(trace: Any) -> list[dict[str, Any]]:
    """One row per (operator name, device): calls, self_us, total_us, largest self time first. `trace` is the
    trace's JSON object, or its events (a list, or an iterator that streams them)."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if events is None or isinstance(events, (str, bytes, dict)) or not hasattr(events, "__iter__"):
        raise ValueError("not a Chrome trace: no traceEvents list")
    # Per thread: start, duration and name index of each host operator, in arrays (24 bytes an operator, not
    # ~150 as tuples: a 400 MB trace holds millions); one string per distinct name.
    threads: dict[tuple[Any, Any], tuple[array, array, array]] = {}
    totals: dict[tuple[str, str], list[float]] = {}
    name_ids: dict[str, int] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        if cat not in HOST_CATEGORIES and cat not in DEVICE_CATEGORIES:
            continue
        try:
            ts, dur, name = float(ev["ts"]), float(ev["dur"]), str(ev["name"])
        except (KeyError, TypeError, ValueError):
            continue
        if cat in HOST_CATEGORIES:
            key = (ev.get("pid"), ev.get("tid"))
            try:
                ops = threads.get(key)
            except TypeError:  # a list or an object as a thread id: data, not a key
                key = (repr(key[0]), repr(key[1]))
                ops = threads.get(key)
            if ops is None:
                ops = threads[key] = (array("d"), array("d"), array("q"))
            ops[0].append(ts)
            ops[1].append(dur)
            ops[2].append(name_ids.setdefault(name, len(name_ids)))
        else:
            _add(totals, name, "cuda", dur, dur)
    names = list(name_ids)
    for ts_a, dur_a, ids_a in threads.values():
        for name_id, self_us, total_us in _self_times(ts_a, dur_a, ids_a):
            _add(totals, names[name_id], "cpu", self_us, total_us)
    rows = [{"operator": name, "device": device, "calls": int(t[0]), "self_us": t[1], "total_us": t[2]}
            for (name, device), t in totals.items()]
    rows.sort(key=lambda r: (r["device"], -r["self_us"], r["operator"]))
    return rows


def _self_times(starts: array, durations: array, names: array) -> Iterable[tuple[int, float, float]]:
    """(name, self, total) per operator of one thread. Self is its duration minus its direct child
    operators'; total is 0 inside an operator of the same name (aten::sum calls aten::sum), so a name's
    summed total never counts the same time twice."""
    ts_all = np.frombuffer(starts, dtype=np.float64)
    dur_all = np.frombuffer(durations, dtype=np.float64)
    order = np.lexsort((-dur_all, ts_all))  # by start, the enclosing one first
    # Open operators: [end, name, duration, time taken by direct children, inside the same name].
    stack: list[list[Any]] = []
    open_names: dict[int, int] = {}

    def finish(entry: list[Any]) -> tuple[int, float, float]:
        open_names[entry[1]] -= 1
        return entry[1], max(0.0, entry[2] - entry[3]), 0.0 if entry[4] else entry[2]

    for ts, dur, name in zip(ts_all[order].tolist(), dur_all[order].tolist(),
                             np.frombuffer(names, dtype=np.int64)[order].tolist()):
        end = ts + dur
        while stack and (stack[-1][0] <= ts or end > stack[-1][0] + _NEST_EPS_US):
            yield finish(stack.pop())  # ended before this one starts, or overlaps it without containing it
        if stack:
            stack[-1][3] += dur
        nested = open_names.get(name, 0) > 0
        open_names[name] = open_names.get(name, 0) + 1
        stack.append([end, name, dur, 0.0, nested])
    while stack:
        yield finish(stack.pop())


def _add(totals: dict[tuple[str, str], list[float]], name: str, device: str, self_us: float, total_us: float) -> None:
    t = totals.get((name, device))
    if t is None:
        totals[(name, device)] = [1, self_us, total_us]
    else:
        t[0] += 1
        t[1] += self_us
        t[2] += total_us


def pstats_rows(stats: Any) -> list[dict[str, Any]]:
    """cProfile's stats dict ({(file, line, name): (cc, nc, tt, ct, callers)}) -> one row per function."""
    if not isinstance(stats, dict):
        raise ValueError("not cProfile stats: a dict was expected")
    rows = []
    for key, value in stats.items():
        file, line, function = key
        _cc, nc, tt, ct = value[:4]
        rows.append({"function": str(function), "file": str(file), "line": int(line), "calls": int(nc),
                     "self_us": float(tt) * 1e6, "total_us": float(ct) * 1e6})
    rows.sort(key=lambda r: (-r["self_us"], r["function"], r["file"], r["line"]))
    return rows


def pyinstrument_rows(root: Any) -> list[dict[str, Any]]:
    """A pyinstrument frame tree -> one row per function. `calls` counts the tree's nodes for it (frames
    seen by a sampler, not calls); total time counts a recursive function's outermost frames only."""
    totals: dict[tuple[str, str, int], list[float]] = {}
    active: dict[tuple[str, str, int], int] = {}  # functions on the path from the root, with their depth count
    # (frame, leaving): leaving=True pops the frame's key off the active path after its children.
    todo: list[tuple[Any, bool]] = [(root, False)] if root is not None else []
    while todo:
        frame, leaving = todo.pop()
        if frame.is_synthetic:  # [self]/[await]/[out-of-context] time is the parent's self time; [root] groups
            todo.extend((c, False) for c in frame.children)
            continue
        key = (str(frame.function), str(frame.file_path or ""), int(frame.line_no or 0))
        if leaving:
            active[key] -= 1
            continue
        t = totals.setdefault(key, [0, 0.0, 0.0])
        t[0] += 1
        t[1] += frame.total_self_time
        if not active.get(key):
            t[2] += frame.time
        active[key] = active.get(key, 0) + 1
        todo.append((frame, True))
        todo.extend((c, False) for c in frame.children)
    rows = [{"function": k[0], "file": k[1], "line": k[2], "calls": int(t[0]), "self_us": t[1] * 1e6,
             "total_us": t[2] * 1e6} for k, t in totals.items()]
    rows.sort(key=lambda r: (-r["self_us"], r["function"], r["file"], r["line"]))
    return rows
