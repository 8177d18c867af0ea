"""SageMaker's system metrics (one JSON line per value: Type, Name, Dimension, Value, NodeId, Timestamp in
s) -> stallwatch snapshots (one wide row per node and moment), streamed file by file into `SystemWriter`.

The lines of one sampling round carry timestamps a few milliseconds apart (CPU, memory, I/O and network are
read one after the other), so values are grouped into a snapshot when they follow each other within
`GAP_US` and no series repeats; SageMaker's intervals are 100 ms and more. Memory holds one block of lines,
one partly filled snapshot and the writer's current segment."""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from stallwatch.importers.sagemaker import system_map
from stallwatch.importers.sagemaker.discovery import SystemFile
from stallwatch.importers.sagemaker.lines import line_blocks, split_last_line
from stallwatch.importers.sagemaker.timestamps import epoch_to_us_array
from stallwatch.log import logger
from stallwatch.records import MetricKey
from stallwatch.store.chunk_writer import SEGMENT_US, StorageBudget
from stallwatch.store.location import RunLocation
from stallwatch.store.system_writer import SystemWriter

GAP_US = 40_000  # values further apart than this are different snapshots
_CAPACITY_INTERVAL_US = 100_000  # the writer's buffer is sized for SageMaker's shortest interval
_INTERVAL_SAMPLES = 4096  # snapshot gaps kept to estimate the sampling interval
_SCHEMA = pa.schema([pa.field("Type", pa.string()), pa.field("Name", pa.string()),
                     pa.field("Dimension", pa.string()), pa.field("Value", pa.float64()),
                     pa.field("Timestamp", pa.float64())])
_PARSE = pajson.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="ignore")
_SEP = "\x1f"


@dataclass
class NodeSystemStats:
    """What one node's import read and stored; the counts SageMaker's reader would report are `lines`."""

    node: str
    files: int = 0
    lines: int = 0  # values read (SageMaker's events)
    lines_by_type: Counter = field(default_factory=Counter)  # SageMaker's Type -> values
    values_stored: int = 0  # imported values (derived ones not counted)
    snapshots: int = 0
    unmapped: Counter = field(default_factory=Counter)  # "type/name/dimension" -> values with no counterpart
    corrupt_lines: int = 0  # lines that are not a JSON object with a numeric Value and Timestamp
    corrupt_last_lines: int = 0  # of those, the last line of a file (a killed writer's half line)
    start_us: int | None = None
    end_us: int | None = None
    sample_interval_ms: int | None = None
    keys: list[MetricKey] = field(default_factory=list)  # the series stored (imported and derived)
    samples_dropped: int = 0  # snapshots the writer could not store


class NodeSystemImporter:
    """One node's minute files, in time order, into its system files."""

    def __init__(self, sink: RunLocation, node: str, budget: StorageBudget) -> None:
        self._sink = sink
        self._budget = budget
        self.stats = NodeSystemStats(node)
        self._key_of: dict[str, int] = {}  # "type\x1fname\x1fdimension" -> raw column, -1: no counterpart
        self._raw: list[MetricKey] = []  # imported series, by raw column
        self._writer: SystemWriter | None = None
        self._plan: tuple[np.ndarray, list[tuple[str, np.ndarray]]] | None = None
        self._pending = (np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.float64))
        self._gaps: list[int] = []
        self._last_ts: int | None = None

    # -- reading ------------------------------------------------------------------------------------------
    def read_file(self, source: RunLocation, f: SystemFile) -> None:
        self.stats.files += 1
        for block, last in line_blocks(source, f.path, on_long_line=self._long_line):
            if last:
                body, tail = split_last_line(block)
                self._add_table(self._parse(body))
                if tail:
                    table = _python_lines([tail])
                    if table.num_rows == 0:
                        self.stats.corrupt_last_lines += 1
                        self.stats.corrupt_lines += 1
                    self._add_table(table)
            else:
                self._add_table(self._parse(block))

    def _long_line(self) -> None:
        self.stats.corrupt_lines += 1

    def _parse(self, data: bytes) -> pa.Table:
        if not data.strip():
            return _SCHEMA.empty_table()
        try:
            return pajson.read_json(pa.BufferReader(data), parse_options=_PARSE)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            lines = [ln for ln in data.split(b"\n") if ln.strip()]
            table = _python_lines(lines)
            self.stats.corrupt_lines += len(lines) - table.num_rows
            return table

    def _add_table(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        ok = pc.and_(pc.is_valid(table["Value"]), pc.is_valid(table["Timestamp"]))
        ok = pc.and_(ok, pc.is_finite(table["Value"]))
        ok = pc.fill_null(pc.and_(ok, pc.is_finite(table["Timestamp"])), False)
        if not pc.all(ok).as_py():
            self.stats.corrupt_lines += table.num_rows - pc.sum(ok).as_py()
            table = table.filter(ok)
            if table.num_rows == 0:
                return
        self.stats.lines += table.num_rows
        types = pc.utf8_lower(pc.fill_null(table["Type"], ""))
        for item in pc.value_counts(types).to_pylist():
            self.stats.lines_by_type[item["values"]] += item["counts"]
        keys = pc.binary_join_element_wise(
            pc.fill_null(table["Type"], ""), pc.fill_null(table["Name"], ""), pc.fill_null(table["Dimension"], ""),
            _SEP).dictionary_encode().combine_chunks()
        columns = np.array([self._column(k) for k in keys.dictionary.to_pylist()], dtype=np.int32)
        col = columns[keys.indices.to_numpy(zero_copy_only=False)]
        mapped = col >= 0
        if not mapped.all():
            counts = np.bincount(keys.indices.to_numpy(zero_copy_only=False)[~mapped], minlength=len(columns))
            for text, count in zip(keys.dictionary.to_pylist(), counts.tolist()):
                if count:
                    self.stats.unmapped["/".join(text.split(_SEP))] += count
        ts = epoch_to_us_array(table["Timestamp"].to_numpy())[mapped].astype(np.int64)
        values = table["Value"].to_numpy()[mapped]
        self._add_rows(ts, col[mapped], values)

    def _column(self, key: str) -> int:
        found = self._key_of.get(key)
        if found is None:
            t, n, d = key.split(_SEP)
            mk = system_map.map_series(t, n, d)
            if mk is None:
                found = -1
            elif mk in self._raw:
                found = self._raw.index(mk)
            else:
                self._raw.append(mk)
                found = len(self._raw) - 1
                self._plan = None  # a new series: the next snapshot goes to a writer that has it
            self._key_of[key] = found
        return found

    # -- snapshots ----------------------------------------------------------------------------------------
    def _add_rows(self, ts: np.ndarray, col: np.ndarray, values: np.ndarray) -> None:
        pts, pcol, pval = self._pending
        ts, col, values = np.concatenate([pts, ts]), np.concatenate([pcol, col]), np.concatenate([pval, values])
        order = np.argsort(ts, kind="stable")
        ts, col, values = ts[order], col[order], values[order]
        starts = np.flatnonzero(np.diff(ts) > GAP_US) + 1
        keep = int(starts[-1]) if len(starts) else 0  # the last group may go on in the next block or file
        self._pending = (ts[keep:], col[keep:], values[keep:])
        if keep:
            self._emit(ts[:keep], col[:keep], values[:keep])

    def finish(self) -> NodeSystemStats:
        ts, col, values = self._pending
        if len(ts):
            self._emit(ts, col, values)
        self._pending = (np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.float64))
        self._close_writer()
        if self._gaps:
            self.stats.sample_interval_ms = max(1, int(round(float(np.median(self._gaps)) / 1000)))
        return self.stats

    def _emit(self, ts: np.ndarray, col: np.ndarray, values: np.ndarray) -> None:
        group = np.concatenate([[0], np.cumsum(np.diff(ts) > GAP_US)])
        group = _split_repeats(group, col, len(self._raw))
        n = int(group[-1]) + 1
        first = np.flatnonzero(np.concatenate([[True], np.diff(group) != 0]))
        snap_ts = ts[first]
        block = np.full((n, len(self._raw)), np.nan)
        block[group, col] = values  # each series at most once per snapshot (repeats were split off)
        self.stats.values_stored += len(values)
        self._write(snap_ts, block)

    def _write(self, snap_ts: np.ndarray, block: np.ndarray) -> None:
        writer = self._ensure_writer()
        assert self._plan is not None
        take, derived = self._plan
        out = np.empty((len(snap_ts), len(writer.keys)), dtype=np.float64)
        for j, source in enumerate(take):
            if source >= 0:
                out[:, j] = block[:, source]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a snapshot without any core: NaN, as it should
            for j, (how, cols) in derived:
                sub = block[:, cols]
                if how == "mean":
                    out[:, j] = np.nanmean(sub, axis=1)
                else:
                    out[:, j] = np.where(np.isnan(sub).all(axis=1), np.nan, np.nansum(sub, axis=1))
        for i in range(len(snap_ts)):
            t = int(snap_ts[i])
            writer.append(t, out[i])
            writer.tick(t)
            if self._last_ts is not None and len(self._gaps) < _INTERVAL_SAMPLES and t > self._last_ts:
                self._gaps.append(t - self._last_ts)
            self._last_ts = t
        self.stats.snapshots += len(snap_ts)
        lo, hi = int(snap_ts.min()), int(snap_ts.max())
        self.stats.start_us = lo if self.stats.start_us is None else min(self.stats.start_us, lo)
        self.stats.end_us = hi if self.stats.end_us is None else max(self.stats.end_us, hi)

    def _ensure_writer(self) -> SystemWriter:
        if self._writer is not None and self._plan is not None:
            return self._writer
        self._close_writer()
        raw = set(self._raw)
        keys = sorted(raw | system_map.derived_keys(raw), key=system_map.device_order)
        self._writer = SystemWriter(self._sink, self.stats.node, keys, interval_us=_CAPACITY_INTERVAL_US,
                                    flush_interval_us=SEGMENT_US, max_bytes=self._budget.limit, budget=self._budget)
        take = np.array([self._raw.index(k) if k in raw else -1 for k in keys], dtype=np.int64)
        derived: list[tuple[int, tuple[str, np.ndarray]]] = []
        for j, k in enumerate(keys):
            if k in system_map.DERIVED_MEAN:
                metric, prefix = system_map.DERIVED_MEAN[k]
                cols = [i for i, r in enumerate(self._raw) if r.metric == metric and r.device.startswith(prefix)
                        and r.device[len(prefix):].isdigit()]
                derived.append((j, ("mean", np.array(cols))))
            elif k in system_map.DERIVED_SUM:
                cols = [i for i, r in enumerate(self._raw) if r.metric == system_map.DERIVED_SUM[k]
                        and r.device in (system_map.NET_ALGORITHM, system_map.NET_PLATFORM)]
                derived.append((j, ("sum", np.array(cols))))
        self._plan = (take, derived)
        self.stats.keys = keys
        return self._writer

    def _close_writer(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self.stats.samples_dropped += self._writer.samples_dropped
        if self._writer.samples_dropped:
            logger.warning("%d snapshots of node %s could not be written", self._writer.samples_dropped,
                           self.stats.node)
        self._writer = None


def _split_repeats(group: np.ndarray, col: np.ndarray, width: int) -> np.ndarray:
    """Groups (time-ordered rows, group ids ascending) in which a series appears twice are split where it
    repeats: a snapshot holds each series once. Only such groups are walked row by row; real outputs have
    none."""
    flat = group.astype(np.int64) * max(width, 1) + col
    order = np.argsort(flat, kind="stable")
    dup = np.flatnonzero(np.diff(flat[order]) == 0)
    if not len(dup):
        return group
    extra = np.zeros(len(group), dtype=np.int64)
    for g in np.unique(group[order[dup]]):
        lo, hi = np.searchsorted(group, g, "left"), np.searchsorted(group, g, "right")
        seen: set[int] = set()
        for i in range(lo, hi):
            c = int(col[i])
            if c in seen:
                extra[i] = 1
                seen = set()
            seen.add(c)
    return group + np.cumsum(extra)


def _python_lines(lines: list[bytes]) -> pa.Table:
    """Lines one by one (the block had a bad line): each a JSON object with a numeric Value and Timestamp,
    or left out."""
    cols: dict[str, list] = {f.name: [] for f in _SCHEMA}
    for line in lines:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(obj, dict):
            continue
        value, when = obj.get("Value"), obj.get("Timestamp")
        if not (_number(value) and _number(when)):
            continue
        cols["Type"].append(_text(obj.get("Type")))
        cols["Name"].append(_text(obj.get("Name")))
        cols["Dimension"].append(_text(obj.get("Dimension")))
        cols["Value"].append(float(value))
        cols["Timestamp"].append(float(when))
    return pa.table(cols, schema=_SCHEMA)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: object) -> str | None:
    return None if value is None else str(value)
