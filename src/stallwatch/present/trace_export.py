"""`stallwatch timeline`: a run as one Chrome-trace / Perfetto JSON file (Trace Event Format). Each node is a
process whose threads are its ranks' framework events (steps with their phases nested inside) and its
torch.profiler windows; a "system" process per node holds the system metrics as counter tracks. Every timestamp
is µs after one origin (the run's earliest time), so all nodes line up; the file is written as it goes."""

from __future__ import annotations

import gzip
import json
import math
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import IO, Any, Callable

import numpy as np
import pyarrow as pa

from stallwatch import catalogue, units
from stallwatch.analyze.engine import Engine, LocalEngine, shared_uri
from stallwatch.analyze.node_tasks import node_timeline, node_timeline_task
from stallwatch.log import logger
from stallwatch.records import (
    BACKWARD,
    COLLECTIVE,
    DATA_WAIT,
    FORWARD,
    OPTIMIZER,
    STEP,
    MetricKey,
)
from stallwatch.store import layout
from stallwatch.store.reader import Run
from stallwatch.timeutil import format_duration

DEFAULT_MAX_POINTS = 10_000  # per counter series: 5,000 min/max buckets
# Perfetto's UI stays responsive up to a few million slices; about 150 bytes of JSON each before gzip.
DEFAULT_MAX_EVENTS = 1_000_000
MAX_TRACE_GZ_BYTES = 128 * 2**20  # a bigger torch.profiler trace is left out (open it on its own)
MAX_TRACE_JSON_BYTES = 1 << 30  # and one that expands to more (streamed, but a bigger one takes minutes)
_COUNT_SLICE_US = 600 * 1_000_000  # the counting pass reads this much time at once (one segment)
_CLOCK_TOLERANCE_US = 60 * 1_000_000  # a torch trace further off its window is realigned to it
_BUFFER = 4096  # events joined per write

# Phases are named by their kind (one colour and one aggregate per kind in Perfetto; chrome://tracing takes the
# catalogue's colour from "cname"); the stored name (the module or optimizer class) goes into args.
_PHASES = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER)
_INSTANT_KINDS = ("dataloader", "stop", "loop", "overhead")  # moments: start == end by definition
_PARENT_FIRST = {"profiling": 0, STEP: 1}  # at equal spans the window encloses the step, the step its phases
_TORCH_PHASES = frozenset("XiICstf")


@dataclass(frozen=True)
class Series:
    """How one stored `device/metric` column becomes a counter track: its name, its unit (the counter's
    argument, so Perfetto shows "<name> <unit>") and the factor from stored units."""

    name: str
    unit: str
    scale: float = 1.0


# (device: exact name, or "gpu#"/"cpu#" for gpu0…/cpu0…, metric) -> (name, unit, scale, in the default set): the
# catalogue's metrics, their track names, in their axis units.
def _track(m: catalogue.Metric) -> tuple[str, str, float, bool]:
    unit, scale = units.axis(m.unit)
    return m.track, unit or m.unit, scale, m.exported


_SERIES: dict[tuple[str, str], tuple[str, str, float, bool]] = {(m.device, m.metric): _track(m)
                                                                for m in catalogue.METRICS}
DEFAULT_METRICS = frozenset(m for (_, m), spec in _SERIES.items() if spec[3])


def series_for(column: str, *, all_metrics: bool = False) -> Series | None:
    """The counter track of a stored column; None when it is not exported (outside the default set)."""
    key = MetricKey.from_column(column)
    pattern = key.device
    for prefix in ("gpu", "cpu"):
        if key.device.startswith(prefix) and key.device[len(prefix):].isdigit():
            pattern = prefix + "#"
    spec = _SERIES.get((pattern, key.metric))
    if spec is None:
        return Series(f"{key.device} {key.metric}", "value") if all_metrics else None
    name, unit, scale, default = spec
    if not (default or all_metrics):
        return None
    return Series(name.format(device=key.device), unit, scale)


@dataclass
class TimelineSummary:
    """What an export wrote, for the command line's lines and for tests."""

    path: str
    origin_us: int
    framework_events: int = 0
    cut_us: int | None = None  # framework events starting at or after this were left out (--max-events)
    counter_series: int = 0
    counter_points: int = 0
    profiler_windows: int = 0
    profiler_events: int = 0
    skipped_windows: list[str] = field(default_factory=list)


# -- time ---------------------------------------------------------------------------------------------------


def run_origin_us(run: Run, info: dict[str, Any] | None = None) -> int:
    """The run's earliest time: node starts, the first stored sample and event, profiling windows."""
    info = run.info if info is None else info
    candidates = [info.get("start_us"), info.get("created_us")]
    candidates.append(run.time_range()[0])
    candidates += [w.get("start_us") for w in run.profiles()]
    found = [c for c in candidates if isinstance(c, int) and not isinstance(c, bool)]
    return min(found) if found else 0


def resolve_time(text: str, origin_us: int, flag: str = "time") -> int:
    """`--start`/`--end`: seconds after the run's start (the trace's time 0), or an ISO 8601 time (UTC when it
    names no zone); µs since the epoch."""
    text = text.strip()
    try:
        return origin_us + int(round(float(text) * 1e6))
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is neither seconds from the run's start (e.g. 3600) nor an ISO time "
                         "(e.g. 2025-11-22T06:40:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(round(when.timestamp() * 1e6))


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).isoformat().replace("+00:00", "Z")


# -- the output --------------------------------------------------------------------------------------------


class TraceFile:
    """The JSON object, written as it goes: `{"traceEvents": [...], "otherData": {...}}`. Hands out process and
    thread ids from one counter: Perfetto keys thread names by tid alone, so no id is used twice."""

    def __init__(self, fh: IO[str]) -> None:
        self._fh = fh
        self._buf: list[str] = []
        self._first = True
        self._next_id = 1
        self._flows: dict[tuple[Any, ...], int] = {}
        self.events = 0
        fh.write('{"displayTimeUnit":"ms","traceEvents":[\n')

    def add(self, event_json: str) -> None:
        self._buf.append(event_json)
        if len(self._buf) >= _BUFFER:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self._fh.write(("" if self._first else ",\n") + ",\n".join(self._buf))
            self.events += len(self._buf)
            self._first = False
            self._buf.clear()

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def process(self, name: str, sort_index: int) -> int:
        pid = self._new_id()
        self.add(f'{{"ph":"M","pid":{pid},"tid":{pid},"ts":0,"name":"process_name","args":{{"name":{_js(name)}}}}}')
        self.add(f'{{"ph":"M","pid":{pid},"tid":{pid},"ts":0,"name":"process_sort_index",'
                 f'"args":{{"sort_index":{sort_index}}}}}')
        return pid

    def thread(self, pid: int, name: str, sort_index: int) -> int:
        tid = self._new_id()
        self.add(f'{{"ph":"M","pid":{pid},"tid":{tid},"ts":0,"name":"thread_name","args":{{"name":{_js(name)}}}}}')
        self.add(f'{{"ph":"M","pid":{pid},"tid":{tid},"ts":0,"name":"thread_sort_index",'
                 f'"args":{{"sort_index":{sort_index}}}}}')
        return tid

    def flow_id(self, key: tuple[Any, ...]) -> int:
        """Flow arrows (torch.profiler's fwdbwd, ac2g) renumbered so two windows' ids never meet."""
        if key not in self._flows:
            self._flows[key] = len(self._flows) + 1
        return self._flows[key]

    def close(self, other_data: dict[str, Any]) -> None:
        self.flush()
        self._fh.write('\n],"otherData":' + json.dumps(other_data, default=str) + "}\n")


def _js(text: Any) -> str:
    """A JSON string: names are data, any text goes (ASCII output, so even lone surrogates survive)."""
    return json.dumps(str(text))


@contextmanager
def _output(path: Path) -> Iterator[IO[str]]:
    """A text stream into `path`, gzipped when it ends in .gz; the file appears only once complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        if path.name.endswith(".gz"):
            raw = open(tmp, "xb")
            fh: IO[str] = gzip.open(raw, "wt", encoding="utf-8", compresslevel=6)  # type: ignore[assignment]
        else:
            raw, fh = None, open(tmp, "x", encoding="utf-8")  # type: ignore[assignment]
        try:
            yield fh
        finally:
            fh.close()
            if raw is not None:
                raw.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# -- export -------------------------------------------------------------------------------------------------


def export_timeline(run: Run, out: str | Path, *, start_us: int | None = None, end_us: int | None = None,
                    max_points: int = DEFAULT_MAX_POINTS, max_events: int = DEFAULT_MAX_EVENTS,
                    all_metrics: bool = False, profiler: bool = True,
                    progress: Callable[[int, int], None] | None = None, engine: Engine | None = None) -> TimelineSummary:
    """Write the run's timeline (events overlapping [start_us, end_us), all when None) to `out`. `max_points`
    bounds each counter series (min/max downsampling keeps spikes); `max_events` bounds framework events by
    cutting the time axis: events starting after the cut are left out on every node alike (0: no cap).
    `progress(nodes_done, nodes)` after each node. Each node's events and downsampled counters are read on
    `engine` (analyze.engine; default: here, one node at a time) and written here in node order."""
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")
    if max_events < 0:
        raise ValueError(f"max_events must be 0 (no cap) or more, got {max_events}")
    if start_us is not None and end_us is not None and start_us >= end_us:
        raise ValueError("the window's start must come before its end")
    info = run.info
    origin = run_origin_us(run, info)
    summary = TimelineSummary(str(out), origin)
    summary.cut_us = _event_cut(run, start_us, end_us, max_events) if max_events else None
    events_end = end_us
    if summary.cut_us is not None:
        events_end = summary.cut_us if end_us is None else min(summary.cut_us, end_us)
    nodes = sorted(set(run.nodes) | set(run.ranks()))
    candidates = [w for w in run.profiles("detailed") if profiler and _in_window(w, start_us, end_us)]
    windows = [w for w in candidates if _in_window(w, start_us, events_end)]
    engine = engine or LocalEngine()
    options = dict(start_us=start_us, end_us=end_us, events_end_us=events_end, max_points=max_points,
                   metrics=None if all_metrics else DEFAULT_METRICS, scale_of=partial(_scale, all_metrics=all_metrics))
    work = partial(node_timeline, run, **options) if engine.name == "local" else \
        partial(node_timeline_task, shared_uri(run.uri), **options)
    with _output(Path(out)) as fh:
        trace = TraceFile(fh)
        for i, part in enumerate(engine.map(work, nodes)):
            node = part.node
            if progress is not None:
                progress(i, len(nodes))
            pid = trace.process(f"node {node}", 2 * i)
            threads = _Threads(trace, pid)
            summary.framework_events += _framework(trace, threads, part.events, origin)
            for w in (w for w in windows if w.get("node") == node):
                merged = _merge_window(trace, threads, run, w, origin, summary.profiler_windows)
                if merged is None:
                    summary.skipped_windows.append(str(w.get("path")))
                else:
                    summary.profiler_windows += 1
                    summary.profiler_events += merged
            system_pid = trace.process(f"system {node}", 2 * i + 1)
            series, points = _counters(trace, part.counters, system_pid, origin, all_metrics)
            summary.counter_series += series
            summary.counter_points += points
        trace.close(_other_data(run, info, summary, start_us, end_us, max_points, max_events))
    if summary.cut_us is not None:
        later = len(candidates) - len(windows)
        logger.warning("timeline: kept the first %d framework events, up to %s into the run; events starting "
                       "later%s were left out (the counters cover the whole window). Export a later window with "
                       "--start/--end, or raise --max-events.", summary.framework_events,
                       format_duration((summary.cut_us - origin) / 1e6),
                       f" and {later} detailed-profiling window(s)" if later else "")
    return summary


def _in_window(w: dict[str, Any], start_us: int | None, end_us: int | None) -> bool:
    ws, we = w.get("start_us"), w.get("end_us")
    if not isinstance(ws, int):
        return False
    we = we if isinstance(we, int) else ws
    return (start_us is None or we >= start_us) and (end_us is None or ws < end_us)


def _other_data(run: Run, info: dict[str, Any], s: TimelineSummary, start_us: int | None, end_us: int | None,
                max_points: int, max_events: int) -> dict[str, Any]:
    """The trace's metadata (Chrome's `otherData`): where time 0 is, what was exported and what was left out."""
    return {
        "generator": "stallwatch timeline", "run": run.uri, "run_id": info.get("run_id"),
        "origin_us": s.origin_us, "origin_utc": _iso(s.origin_us),
        "time_unit": "µs after origin_us (µs since the Unix epoch, UTC)",
        "window_start_us": start_us, "window_end_us": end_us,
        "framework_events": s.framework_events, "max_events": max_events,
        "framework_cut_us": s.cut_us,
        "counter_series": s.counter_series, "counter_points": s.counter_points, "max_points_per_series": max_points,
        "profiler_windows": s.profiler_windows, "profiler_events": s.profiler_events,
        "skipped_profiler_windows": s.skipped_windows,
    }


def _event_cut(run: Run, start_us: int | None, end_us: int | None, cap: int) -> int | None:
    """The time before which at most `cap` framework events of the window start, or None when all fit. Reads
    the events' starts slice by slice in time order, a node at a time, and stops once the cap is passed; of a
    slice it keeps only the earliest starts that can still be the cut (at most `cap`), so a long run of many
    nodes costs one node's slice of starts and the cap's."""
    slices = [(a, b) for a, b in run.time_slices(_COUNT_SLICE_US, (layout.FRAMEWORK_DIR,))
              if (end_us is None or a < end_us) and (start_us is None or b > start_us)]  # gaps are skipped
    views = run.pinned_by_node()  # listed once: each node's reads sort and filter its own files only
    nodes = sorted(run.ranks())
    seen = 0
    for i, (a, b) in enumerate(slices):
        a = a if start_us is None else max(a, start_us)
        b = b if end_us is None else min(b, end_us)
        need = cap - seen + 1  # the slice's earliest starts up to the cut's
        earliest, count = np.empty(0, np.int64), 0
        for node in nodes:
            view = views.get(node)
            if view is None:
                continue
            starts = view.framework(start_us=start_us if i == 0 else a, end_us=b, nodes=[node],
                                    fields=["start_us"])["start_us"].to_numpy()
            if i:
                starts = starts[starts >= a]  # the ones that started earlier were counted in an earlier slice
            count += len(starts)
            earliest = np.concatenate([earliest, starts])
            if len(earliest) > need:
                earliest = np.partition(earliest, need - 1)[:need]
        if seen + count > cap:
            return int(np.sort(earliest)[cap - seen])
        seen += count
    return None


class _Threads:
    """Thread ids of one node's process by label, made (with their name) on first use."""

    def __init__(self, trace: TraceFile, pid: int) -> None:
        self.trace, self.pid = trace, pid
        self._tids: dict[str, int] = {}

    def tid(self, label: str) -> int:
        tid = self._tids.get(label)
        if tid is None:
            tid = self._tids[label] = self.trace.thread(self.pid, label, len(self._tids))
        return tid


def _framework(trace: TraceFile, threads: _Threads, table: pa.Table, origin: int) -> int:
    """One node's framework events: a thread per rank (steps with their phases nested inside), a thread per
    data-loader fetcher; an event that would cross another's edges goes to an extra lane, since a thread's
    slices must nest. Returns the number of events written."""
    if not table.num_rows:
        return 0
    table = table.unify_dictionaries().combine_chunks()
    (kind, kinds), (name, names), (mode, modes) = (_codes(table, c) for c in ("kind", "name", "mode"))
    rank, start, end = (table[c].to_numpy() for c in ("rank", "start_us", "end_us"))
    has_step = table["step"].is_valid().to_numpy(zero_copy_only=False).tolist()
    step = table["step"].fill_null(0).to_numpy().tolist()
    args = table["args"].to_pylist()
    prio = np.array([_PARENT_FIRST.get(k, 2) for k in kinds], dtype=np.int64)[kind]
    order = np.lexsort((prio, -end, start, rank)).tolist()  # per rank by start, enclosing events first
    kind, name, mode = kind.tolist(), name.tolist(), mode.tolist()
    rank, start, end = rank.tolist(), start.tolist(), end.tolist()

    lanes: dict[tuple[int, str], list[list[int]]] = {}
    heads: dict[tuple[int, int, int], tuple[str, str]] = {}
    stored: dict[str, dict[str, Any]] = {}
    for i in order:
        kind_name, event_name, r, s, e = kinds[kind[i]], names[name[i]], rank[i], start[i], end[i]
        group = f"data {event_name}" if kind_name == "fetch" else ""
        instant = kind_name in _INSTANT_KINDS
        lane = 0 if instant else _lane(lanes.setdefault((r, group), []), s, e)
        tid = threads.tid(f"rank {r}" + (f" · {group}" if group else "") + (f" · overlapping {lane}" if lane else ""))
        key = (kind[i], name[i], mode[i])
        if key not in heads:
            heads[key] = _head(kind_name, event_name, modes[mode[i]])
        body, args_tail = heads[key]
        if args[i]:
            if args[i] not in stored:
                stored[args[i]] = _stored_args(args[i])
            extra = {**stored[args[i]], **json.loads("{" + args_tail)}
            if has_step[i]:
                extra["step"] = step[i]
            args_json = json.dumps(extra)
        else:
            args_json = "{" + (f'"step":{step[i]},' if has_step[i] else "") + args_tail
        if instant:
            trace.add(f'{{"ph":"i","s":"t","pid":{threads.pid},"tid":{tid},"ts":{s - origin},{body},'
                      f'"args":{args_json}}}')
        else:
            trace.add(f'{{"ph":"X","pid":{threads.pid},"tid":{tid},"ts":{s - origin},"dur":{max(0, e - s)},'
                      f'{body},"args":{args_json}}}')
    return len(order)


def _codes(table: pa.Table, column: str) -> tuple[np.ndarray, list[str]]:
    """A dictionary column (one chunk, unified) as its codes and its dictionary."""
    col = table[column].chunk(0)
    return col.indices.to_numpy(zero_copy_only=False).astype(np.int64), col.dictionary.to_pylist()


def _head(kind: str, name: str, mode: str) -> tuple[str, str]:
    """For events of one (kind, name, mode): '"name":…,"cat":…' and the end of their args ('"mode":…}').
    Phases are titled by their kind, their stored name goes into args."""
    extra = ""
    if kind in _PHASES:
        title, extra = kind, f',"name":{_js(name)}'
    elif kind == "profiling":
        title = f"profiling {name}"
    else:
        title = name or kind
    phase = catalogue.phase(kind) if kind in _PHASES or kind == COLLECTIVE else None
    colour = f',"cname":{_js(phase.trace_colour)}' if phase is not None and phase.trace_colour else ""
    return f'"name":{_js(title)},"cat":{_js(kind)}{colour}', f'"mode":{_js(mode)}{extra}}}'


def _stored_args(text: str) -> dict[str, Any]:
    """An event's stored args (JSON text) as a dict; text that is not a JSON object is kept as it is."""
    try:
        value = json.loads(text)
    except ValueError:
        return {"args": text}
    return _finite(value) if isinstance(value, dict) else {"args": _finite(value)}


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such numbers become text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _lane(stacks: list[list[int]], start: int, end: int) -> int:
    """The first lane where [start, end] nests (inside the innermost open event, or after it); events come
    sorted by start, longest first. Each lane keeps the ends of its open events."""
    for i, stack in enumerate(stacks):
        while stack and stack[-1] <= start:
            stack.pop()
        if not stack or end <= stack[-1]:
            stack.append(end)
            return i
    stacks.append([end])
    return len(stacks) - 1


# -- system metrics -------------------------------------------------------------------------------------------


def _scale(column: str, *, all_metrics: bool) -> float | None:
    """The factor a stored column is exported with; None when it is not exported."""
    spec = series_for(column, all_metrics=all_metrics)
    return None if spec is None else spec.scale


def _counters(trace: TraceFile, counters: list[tuple[str, np.ndarray, np.ndarray]], pid: int, origin: int,
              all_metrics: bool) -> tuple[int, int]:
    """One counter track per exported series of the node (`node_tasks.node_timeline`: at most max_points
    points, min and max per time bucket, so spikes and dips survive). Returns (series, points)."""
    series = points = 0
    for column, ts, values in counters:
        spec = series_for(column, all_metrics=all_metrics)
        assert spec is not None
        prefix = f'{{"ph":"C","pid":{pid},"tid":{pid},"name":{_js(spec.name)},"ts":'
        unit = _js(spec.unit)
        for t, v in zip((ts - origin).tolist(), values.tolist()):
            trace.add(f'{prefix}{t},"args":{{{unit}:{v:.6g}}}}}')
        series += 1
        points += len(ts)
    return series, points


# -- torch.profiler windows -----------------------------------------------------------------------------------


def _merge_window(trace: TraceFile, threads: _Threads, run: Run, window: dict[str, Any], origin: int,
                  index: int) -> int | None:
    """A detailed-profiling window's torch.profiler events on the node's time axis, as extra threads of its
    rank ("rank 0 · torch.profiler"); None, with a log line, when its trace cannot be read."""
    path = str(window.get("path"))
    top: dict[str, Any] = {}
    meta: list[dict[str, Any]] = []
    first_slice: float | None = None
    try:
        sizes = [e.size for e in run.location.list(path) if e.path.endswith(layout.TRACE_JSON_GZ)]
        if not sizes:
            raise ValueError("the window has no trace.json.gz")
        if sizes[0] > MAX_TRACE_GZ_BYTES:
            raise ValueError(f"its trace is {sizes[0] / 2**20:.0f} MB gzipped, more than "
                             f"{MAX_TRACE_GZ_BYTES / 2**20:.0f} MB: open it on its own")
        size = run.trace_size(path, MAX_TRACE_JSON_BYTES)
        if size > MAX_TRACE_JSON_BYTES:
            raise ValueError(f"its trace holds more than {MAX_TRACE_JSON_BYTES / 2**20:.0f} MB of JSON: open it "
                             "on its own")
        # Streamed twice, never held: first what places it on the time axis (its clock's base is often the
        # file's last field), then the events themselves.
        for e in run.trace_events(path, top):
            if isinstance(e, dict) and e.get("ph") == "M":
                meta.append(e)
            elif _kept(e) and e["ph"] == "X":
                first_slice = float(e["ts"]) if first_slice is None else min(first_slice, float(e["ts"]))
    except Exception as exc:
        logger.warning("timeline: left out profiling window %s (%s)", window.get("path"), exc)
        return None
    base_ns = top.get("baseTimeNanoseconds")
    if isinstance(base_ns, (int, float)) and not isinstance(base_ns, bool) and math.isfinite(base_ns):
        offset = (int(base_ns) - origin * 1000) / 1000  # wall time = baseTimeNanoseconds / 1000 + ts
    else:
        offset = float(-origin)  # older traces: ts already µs since the epoch
    if first_slice is not None and isinstance(window.get("start_us"), int):
        if abs(first_slice + offset - (window["start_us"] - origin)) > _CLOCK_TOLERANCE_US:
            logger.warning("timeline: the trace of %s is on another clock than its window; aligned to the "
                           "window's start", window.get("path"))
            offset = window["start_us"] - origin - first_slice
    names = _torch_names(meta)
    rank = window.get("rank")
    written = 0
    try:
        for e in run.trace_events(path):
            if not _kept(e):
                continue
            out = dict(e)
            out["pid"] = threads.pid
            out["tid"] = threads.tid(_torch_label(rank, window.get("pid"), e.get("pid"), e.get("tid"), names))
            out["ts"] = round(float(e["ts"]) + offset, 3)
            if e.get("ph") in ("s", "t", "f") and "id" in e:
                out["id"] = trace.flow_id((index, str(e.get("cat")), str(e["id"])))
            try:
                trace.add(json.dumps(_finite(out)))
            except (TypeError, ValueError):
                continue
            written += 1
    except Exception as exc:  # it read whole a moment ago: changed under us
        logger.warning("timeline: profiling window %s was cut short after %d events (%s)", path, written, exc)
    return written


def _kept(e: Any) -> bool:
    """A torch.profiler event the timeline shows: a slice, instant, counter or flow with a finite time."""
    return (isinstance(e, dict) and e.get("ph") in _TORCH_PHASES and _number(e.get("ts"))
            and (e["ph"] != "X" or (_number(e.get("dur")) and e["dur"] >= 0)))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _torch_names(events: list[Any]) -> dict[tuple[str, str], str]:
    """Process and thread names from the trace's metadata: (pid, "") and (pid, tid) -> name. A process's label
    wins over its name: kineto names GPU processes "python" and labels them "GPU 0"."""
    out: dict[tuple[str, str], str] = {}
    labels: dict[tuple[str, str], str] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "M" or not isinstance(e.get("args"), dict):
            continue
        pid, kind = str(e.get("pid")), e.get("name")
        value = str(e["args"].get("labels" if kind == "process_labels" else "name") or "").strip()
        if not value:
            continue
        if kind == "process_name":
            out[(pid, "")] = value
        elif kind == "process_labels":
            labels[(pid, "")] = value
        elif kind == "thread_name":
            out[(pid, str(e.get("tid")))] = value
    return {**out, **labels}


def _torch_label(rank: Any, job_pid: Any, pid: Any, tid: Any, names: dict[tuple[str, str], str]) -> str:
    """'rank 0 · torch.profiler' for the profiled thread (and global markers); other threads, devices (GPU
    streams) and the profiler's own spans named after the trace's process and thread names."""
    base = f"rank {rank} · torch.profiler"
    pid, tid, job = str(pid), str(tid), str(job_pid)
    if pid in ("", "None") or tid in ("", "None") or (pid == job and tid == job):
        return base
    thread = names.get((pid, tid)) or (f"thread {tid}" if tid.lstrip("-").isdigit() else tid)
    process = names.get((pid, ""))
    if pid == job or (process is None and not pid.lstrip("-").isdigit()):
        return f"{base} · {thread}"
    return f"{base} · {process or 'process ' + pid} {thread}"
