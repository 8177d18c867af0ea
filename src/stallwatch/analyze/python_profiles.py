"""The top functions of each Python-profiling window (cProfile or pyinstrument), from the per-function summary the
sampler wrote beside the raw profile when it stored the window (functions.parquet): a run directory is data, so
the report never unmarshals a pstats file or loads a pyinstrument session to show what a capture holds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

TOP = 15  # functions shown per window


@dataclass(frozen=True)
class Function:
    """One function's totals in a window: own time (in the function itself), cumulative time (with what it
    called), calls (frames seen, for pyinstrument)."""
    function: str
    file: str
    line: int
    calls: int
    self_us: float
    total_us: float


@dataclass(frozen=True)
class WindowFunctions:
    """A Python-profiling window and its most expensive functions by own time."""
    node: str
    rank: str
    window: str
    path: str
    start_us: int
    end_us: int | None
    profiler: str
    first_step: int | None
    last_step: int | None
    total: int  # functions in the summary
    top: list[Function] = field(default_factory=list)
    summary_error: str | None = None


def window_functions(windows: Iterable[Mapping[str, Any]], functions: pa.Table, top: int = TOP) -> list[WindowFunctions]:
    """Per Python window (`Run.profiles("python")`), its `top` functions by own time from `Run.functions()`."""
    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in functions.to_pylist():
        rows.setdefault((str(r["node"]), str(r["rank"]), str(r["window"])), []).append(r)
    out = []
    for w in windows:
        mine = rows.get((str(w.get("node")), str(w.get("rank")), str(w.get("window"))), [])
        mine.sort(key=lambda r: (-_num(r.get("self_us")), str(r.get("function"))))
        start, end = w.get("start_us"), w.get("end_us")
        first, last = w.get("first_step"), w.get("last_step")
        error = w.get("summary_error")
        out.append(WindowFunctions(
            str(w.get("node")), str(w.get("rank")), str(w.get("window")), str(w.get("path", "")),
            start if isinstance(start, int) else 0, end if isinstance(end, int) else None,
            str(w.get("profiler") or "Python profiler"), first if isinstance(first, int) else None,
            last if isinstance(last, int) else None, len(mine),
            [Function(str(r.get("function")), str(r.get("file") or ""), int(r.get("line") or 0),
                      int(r.get("calls") or 0), _num(r.get("self_us")), _num(r.get("total_us"))) for r in mine[:top]],
            error if isinstance(error, str) else None))
    return out


def _num(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if v == v else 0.0
