"""SageMaker's profiling windows -> stallwatch's (traces/<node>/<rank>/<window>/): TensorFlow detailed-profiling
traces (Chrome trace JSON, gzipped, times relative to the profiler's start) and cProfile stats (`python_stats`).

A TF trace is stored with `baseTimeNanoseconds` added (the profiler's start from SageMaker's `.metadata` file),
so, as for torch.profiler traces, an event's wall-clock time is baseTimeNanoseconds / 1000 + ts µs; its
operators are summed per (name, device) like a torch trace's. cProfile stats are stored as written, with their
per-function summary."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from posixpath import basename
from typing import Any

from stallwatch.collect.profile_summary import pstats_rows
from stallwatch.importers.sagemaker.discovery import StatsFile, TfTrace, split_process
from stallwatch.importers.sagemaker.pstats_reader import load_stats
from stallwatch.importers.sagemaker.timestamps import epoch_from_text
from stallwatch.records import EVAL, GLOBAL, TRAIN
from stallwatch.store import layout, profiles_codec, run_writer
from stallwatch.store.location import RunLocation

MAX_TRACE_BYTES = 256 * 2**20  # a larger (uncompressed) trace is stored as it is, without summary or time base
MAX_STATS_BYTES = 256 * 2**20
_NEST_EPS_US = 0.01
_PY_MODES = {"train": TRAIN, "eval": EVAL}

# (node or None, rank, start_us, end_us) -> (first step, last step) of the TRAIN steps in that span
StepsInSpan = Callable[[str, str, int, int], "tuple[int, int] | None"]
ResolveNode = Callable[["str | None", str], str]


@dataclass
class WindowStats:
    detailed: int = 0
    python: int = 0
    operators: int = 0  # rows of operators.parquet written
    functions: int = 0
    skipped: list[str] = field(default_factory=list)  # "path: why"
    summary_errors: list[str] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)  # where windows were stored (each gets a node record)
    start_us: dict[str, int] = field(default_factory=dict)  # node -> its earliest window start
    end_us: dict[str, int] = field(default_factory=dict)


class WindowImporter:
    def __init__(self, source: RunLocation, sink: RunLocation, resolve_node: ResolveNode,
                 steps_in: StepsInSpan) -> None:
        self._source = source
        self._sink = sink
        self._resolve = resolve_node
        self._steps_in = steps_in
        self._used: set[tuple[str, str, str]] = set()
        self.stats = WindowStats()

    # -- TensorFlow detailed profiling --------------------------------------------------------------------
    def tf_trace(self, t: TfTrace) -> None:
        host, rank, start_us, end_us, base = t.host, "0", None, None, "metadata"
        if t.metadata:
            process, _, span = basename(t.metadata)[:-len(".metadata")].partition("_")
            first, _, last = span.partition("_")
            found_host, rank = split_process(process)
            host = found_host or host
            start_us, end_us = epoch_from_text(first), epoch_from_text(last)
        if start_us is None:
            start_us, base = _profile_dir_time(t.run_dir), "directory name (whole seconds)"
        if start_us is None:
            self.stats.skipped.append(f"{t.path}: no .metadata file and no time in its directory name")
            return
        node = self._resolve(host, rank)
        with self._source.open_input_stream(t.path) as fh:
            raw = fh.read(MAX_TRACE_BYTES + 1)
        summary_error = None
        rows: list[dict[str, Any]] = []
        activities = ["cpu"]
        stored = raw
        try:
            text = _gunzip(raw, MAX_TRACE_BYTES)
            trace = json.loads(text)
            events = trace.get("traceEvents") if isinstance(trace, dict) else None
            if not isinstance(events, list):
                raise ValueError("not a Chrome trace (no traceEvents list)")
            rows, gpu, last_us = tf_operator_rows(events)
            if gpu:
                activities = ["cpu", "cuda"]
            if end_us is None and last_us is not None:
                end_us = start_us + int(round(last_us))
            stored = gzip.compress(_with_base_time(text, start_us), compresslevel=6, mtime=0)
        except (ValueError, RecursionError, OSError, EOFError, zlib.error) as exc:
            summary_error = f"the trace could not be summarized: {exc}"
            self.stats.summary_errors.append(f"{t.path}: {exc}")
        files = {layout.TRACE_JSON_GZ: stored}
        if rows:
            files[layout.OPERATORS_PARQUET] = profiles_codec.encode_operators(rows)
            self.stats.operators += len(rows)
        end_us = end_us if end_us is not None else start_us
        steps = self._steps_in(node, rank, start_us, end_us)
        record = {
            "layer": "detailed", "start_us": start_us, "end_us": end_us, "mode": TRAIN if steps else GLOBAL,
            "first_step": steps[0] if steps else t.step, "last_step": steps[1] if steps else t.step,
            "pid": int(rank) if rank.isdigit() else 0, "profiler": "tensorflow.profiler", "timer": None,
            "activities": activities, "status": "complete", "summary_error": summary_error,
            "imported": {"from": "SageMaker Debugger", "source": t.path, "time_base": base},
        }
        self._store(node, rank, "detailed", start_us, files, record)
        self.stats.detailed += 1

    # -- Python profiling ---------------------------------------------------------------------------------
    def python_stats(self, s: StatsFile) -> None:
        if s.profiler != "cprofile":
            self.stats.skipped.append(f"{s.path}: pyinstrument output has no counterpart (only cProfile stats are "
                                      "imported)")
            return
        span = _stats_span(s)
        if span is None:
            self.stats.skipped.append(f"{s.path}: its directory name {s.directory!r} gives no time span")
            return
        process, start_us, end_us, mode, first, last = span
        host, rank = split_process(process) if process else (None, "0")
        node = self._resolve(host, rank)
        with self._source.open_input_stream(s.path) as fh:
            data = fh.read(MAX_STATS_BYTES + 1)
        if len(data) > MAX_STATS_BYTES:
            self.stats.skipped.append(f"{s.path}: larger than {MAX_STATS_BYTES // 2**20} MB")
            return
        files = {layout.PSTATS: data}
        summary_error = None
        try:
            rows = pstats_rows(load_stats(data))
            files[layout.FUNCTIONS_PARQUET] = profiles_codec.encode_functions(rows)
            self.stats.functions += len(rows)
        except ValueError as exc:
            summary_error = f"the stats could not be summarized: {exc}"
            self.stats.summary_errors.append(f"{s.path}: {exc}")
        record = {
            "layer": "python", "start_us": start_us, "end_us": end_us, "mode": mode, "first_step": first,
            "last_step": last, "pid": int(rank) if rank.isdigit() else 0, "profiler": "cprofile", "timer": None,
            "activities": [], "status": "complete", "summary_error": summary_error,
            "imported": {"from": "SageMaker Debugger", "source": s.path},
        }
        self._store(node, rank, "python", start_us, files, record)
        self.stats.python += 1

    def _store(self, node: str, rank: str, layer: str, start_us: int, files: dict[str, bytes],
               record: dict[str, Any]) -> None:
        window = layout.window_name(layer, start_us)
        k = 1
        while (node, rank, window) in self._used:  # two windows of one rank starting in the same µs
            k += 1
            window = f"{layout.window_name(layer, start_us)}-{k}"
        self._used.add((node, rank, window))
        self.stats.nodes.add(node)
        self.stats.start_us[node] = min(start_us, self.stats.start_us.get(node, start_us))
        end_us = int(record.get("end_us") or start_us)
        self.stats.end_us[node] = max(end_us, self.stats.end_us.get(node, end_us))
        run_writer.write_profile_window(self._sink, node, rank, window, files,
                                        {**record, "node": node, "rank": int(rank) if rank.isdigit() else rank,
                                         "window": window})


def tf_operator_rows(events: list[Any]) -> tuple[list[dict[str, Any]], bool, float | None]:
    """Per (operator, device) totals of a TF profiler trace: complete events of `/host:*` processes are CPU
    operators, of `/device:GPU:*` processes GPU ones; self time is the duration less the direct children's on
    the same thread. Also whether the trace has GPU processes, and its last end (µs from its start)."""
    names: dict[Any, str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name" and \
                isinstance(e.get("args"), dict):
            names[e.get("pid")] = str(e["args"].get("name", ""))
    gpu = any(n.startswith("/device:GPU") for n in names.values())
    threads: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    last: float | None = None
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            ts, dur, name = float(e["ts"]), float(e["dur"]), str(e["name"])
        except (KeyError, TypeError, ValueError):
            continue
        last = ts + dur if last is None else max(last, ts + dur)
        process = names.get(e.get("pid"), "")
        device = "cpu" if process.startswith("/host:") else "cuda" if process.startswith("/device:GPU") else None
        if device is not None:
            threads.setdefault((device, e.get("pid"), e.get("tid")), []).append((ts, dur, name))
    totals: dict[tuple[str, str], list[float]] = {}
    for (device, _, _), ops in threads.items():
        for name, self_us, total_us in _nested(ops):
            t = totals.setdefault((name, device), [0, 0.0, 0.0])
            t[0] += 1
            t[1] += self_us
            t[2] += total_us
    rows = [{"operator": n, "device": d, "calls": int(t[0]), "self_us": t[1], "total_us": t[2]}
            for (n, d), t in totals.items()]
    rows.sort(key=lambda row: (row["device"], -row["self_us"], row["operator"]))
    return rows, gpu, last


def _nested(ops: list[tuple[float, float, str]]):
    """(name, self, total) per event of one thread: self is its duration less its direct children's; an event
    inside one of the same name adds no total (its time is already counted)."""
    ops.sort(key=lambda o: (o[0], -o[1]))
    stack: list[list[Any]] = []  # [end, name, duration, children's time, inside the same name]
    open_names: dict[str, int] = {}

    def close(entry: list[Any]) -> tuple[str, float, float]:
        open_names[entry[1]] -= 1
        return entry[1], max(0.0, entry[2] - entry[3]), 0.0 if entry[4] else entry[2]

    for ts, dur, name in ops:
        end = ts + dur
        while stack and (stack[-1][0] <= ts or end > stack[-1][0] + _NEST_EPS_US):
            yield close(stack.pop())
        if stack:
            stack[-1][3] += dur
        stack.append([end, name, dur, 0.0, open_names.get(name, 0) > 0])
        open_names[name] = open_names.get(name, 0) + 1
    while stack:
        yield close(stack.pop())


def _gunzip(raw: bytes, limit: int) -> bytes:
    if len(raw) > limit:
        raise ValueError(f"larger than {limit // 2**20} MB")
    if raw[:2] != b"\x1f\x8b":
        return raw
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as fh:
        out = fh.read(limit + 1)
    if len(out) > limit:
        raise ValueError(f"larger than {limit // 2**20} MB uncompressed")
    return out


def _with_base_time(text: bytes, start_us: int) -> bytes:
    """The trace object with `baseTimeNanoseconds` first: its events' ts are µs from the profiler's start."""
    at = text.find(b"{")
    if at < 0:
        raise ValueError("not a JSON object")
    return text[:at + 1] + f'"baseTimeNanoseconds": {start_us * 1000}, '.encode() + text[at + 1:]


def _profile_dir_time(name: str) -> int | None:
    """TF's plugins/profile/<YYYY_MM_DD_HH_MM_SS> (the instance's clock: UTC on SageMaker)."""
    try:
        when = datetime.strptime(name, "%Y_%m_%d_%H_%M_%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return int(when.timestamp()) * 1_000_000


def _stats_span(s: StatsFile) -> tuple[str | None, int, int, str, int | None, int | None] | None:
    """(process, start_us, end_us, mode, first step, last step) from a stats directory's name. Newer outputs:
    `<mode>-<step>-<phase>-<time>_<mode>-<step>-<phase>-<time>` under the process's directory; older ones:
    `<start>_<end>_<process>_<step>` (step -1: before step 0)."""
    head = s.directory.split("_", 1)[0]
    if "-" in head:
        try:
            begin, end = s.directory.split("_")
            b_mode, b_step, _, b_time = begin.split("-")
            _, e_step, _, e_time = end.split("-")
        except ValueError:
            return None
        start_us, end_us = epoch_from_text(b_time), epoch_from_text(e_time)
        if start_us is None or end_us is None:
            return None
        first = int(b_step) if b_step.isdigit() else None
        last = int(e_step) if e_step.isdigit() else first
        return s.process, start_us, end_us, _PY_MODES.get(b_mode, GLOBAL), first, last
    parts = s.directory.split("_")
    if len(parts) < 4:
        return None
    start_us, end_us = epoch_from_text(parts[0]), epoch_from_text(parts[1])
    if start_us is None or end_us is None:
        return None
    step = parts[-1]
    number = int(step) if step.isdigit() else None
    return "_".join(parts[2:-1]), start_us, end_us, TRAIN if number is not None else GLOBAL, number, number
