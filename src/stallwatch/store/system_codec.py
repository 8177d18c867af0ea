"""How system snapshots become Parquet bytes and back: one wide row per snapshot, float32 values."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stallwatch.records import TIMESTAMP, MetricKey
from stallwatch.store.ipc_check import encode_checked, read_checked
from stallwatch.store.layout import PART

# Resolution kept per metric: far finer than the sensors, coarse enough that zstd finds the repetition.
_DECIMALS_BY_SUFFIX = (("_util", 2), ("_iowait", 2), ("_bps", 0), ("_bytes", 0), ("_w", 1), ("_c", 1), ("_mhz", 0))
# Integer-like series with few distinct values compress best with a dictionary; the rest with byte-stream-split.
_DICTIONARY_METRICS = ("gpu_util", "gpu_mem_bw_util", "gpu_temp_c", "gpu_sm_clock_mhz", "num_procs",
                       "workers_alive", "workers_busy")


def decimals_for(metric: str) -> int | None:
    for suffix, d in _DECIMALS_BY_SUFFIX:
        if metric.endswith(suffix):
            return d
    return None


def _columns_by_decimals(keys: list[MetricKey]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for j, key in enumerate(keys):
        d = decimals_for(key.metric)
        if d is not None:
            groups.setdefault(d, []).append(j)
    return groups


def _to_table(keys: list[MetricKey], timestamps: np.ndarray, values: np.ndarray) -> pa.Table:
    arrays = [pa.array(timestamps.astype(np.int64, copy=False))]
    for j, key in enumerate(keys):
        col = values[:, j]
        d = decimals_for(key.metric)
        if d is not None:
            col = np.round(col, d)
        arrays.append(pa.array(col.astype(np.float32), from_pandas=True))  # NaN -> null
    return pa.Table.from_arrays(arrays, names=[TIMESTAMP] + [k.column for k in keys])


class PartEncoder:
    """Parts of one writer's columns, written every flush by a process that wakes up cold. What does not change
    between flushes is made once: the schema, the rounding groups, and Arrow arrays over a scratch block that
    each flush fills and slices (one call, not one per column). No null masks (readers treat NaN as missing);
    rounded exactly as segments are (one np.round per resolution): a snapshot reads the same before and after
    compaction, so rules following a live run agree with a later batch evaluation."""

    def __init__(self, keys: list[MetricKey]) -> None:
        self._schema = pa.schema([pa.field(TIMESTAMP, pa.int64())] + [pa.field(k.column, pa.float32()) for k in keys])
        self._groups = list(_columns_by_decimals(keys).items())
        self._width = len(keys)
        self._rows = 0
        self._grow(16)

    def _grow(self, rows: int) -> None:
        self._rows = rows
        self._ts = np.zeros(rows, dtype=np.int64)
        self._block = np.full((self._width, rows), np.nan, dtype=np.float32)  # a column per row: contiguous
        block, f32 = pa.py_buffer(self._block), pa.float32()
        columns = [pa.Array.from_buffers(f32, rows, [None, block], offset=j * rows) for j in range(self._width)]
        self._batch = pa.RecordBatch.from_arrays([pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(
            self._ts)])] + columns, schema=self._schema)

    def encode(self, timestamps: np.ndarray, values: np.ndarray) -> bytes:
        n = len(timestamps)
        if n > self._rows:
            self._grow(max(n, 2 * self._rows))
        rounded = np.array(values, dtype=np.float64, copy=True)
        for d, cols in self._groups:
            rounded[:, cols] = np.round(rounded[:, cols], d)
        self._ts[:n] = timestamps
        self._block[:, :n] = rounded.T  # the arrays above see it: they are views of this memory
        return encode_checked(self._schema, [self._batch.slice(0, n)])


def encode(kind: str, keys: list[MetricKey], timestamps: np.ndarray, values: np.ndarray) -> bytes:
    """A part (Arrow IPC: cheap to write, short-lived) or a segment (Parquet: compact, long-lived)."""
    if kind == PART:
        return PartEncoder(keys).encode(timestamps, values)
    sink = io.BytesIO()
    table = _to_table(keys, timestamps, values)
    dict_cols = [k.column for k in keys if k.metric in _DICTIONARY_METRICS]
    encodings = {TIMESTAMP: "DELTA_BINARY_PACKED"}
    encodings.update({k.column: "BYTE_STREAM_SPLIT" for k in keys if k.metric not in _DICTIONARY_METRICS})
    # Page checksums (CRC32): a flipped bit is a read error naming the file, never a silently different value.
    pq.write_table(table, sink, compression="zstd", use_dictionary=dict_cols or False, write_page_checksum=True,
                   column_encoding=encodings, write_statistics=[TIMESTAMP], row_group_size=1 << 20)
    return sink.getvalue()


def read_schema(source: Any, kind: str) -> pa.Schema:
    if kind == PART:
        return pa.ipc.open_file(source).schema
    return pq.ParquetFile(source).schema_arrow


def count_rows(source: Any, kind: str) -> int:
    if kind == PART:
        return read_checked(source).num_rows
    return pq.ParquetFile(source).metadata.num_rows


def column_span(source: Any, kind: str, low: str, high: str) -> tuple[int, int] | None:
    """(min of column `low`, max of column `high`) of a stored file, from a segment's statistics when it has
    them, else from the columns; None when the file holds no rows."""
    import pyarrow.compute as pc

    if kind != PART:
        pf = pq.ParquetFile(source, page_checksum_verification=True)  # statistics: from the footer alone
        meta = pf.metadata
        names = pf.schema_arrow.names
        lows, highs = [], []
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            stats = [group.column(names.index(c)).statistics for c in (low, high)]
            if group.num_rows == 0:
                continue
            if not all(st is not None and st.has_min_max for st in stats):
                break
            lows.append(stats[0].min)
            highs.append(stats[1].max)
        else:
            return (int(min(lows)), int(max(highs))) if lows else None
        table = pf.read(columns=sorted({low, high}))
    else:
        table = read_checked(source).select(sorted({low, high}))
    if table.num_rows == 0:
        return None
    lo, hi = pc.min(table[low]).as_py(), pc.max(table[high]).as_py()
    return None if lo is None or hi is None else (int(lo), int(hi))


def read_columns(source: Any, kind: str, metrics: set[str] | None) -> pa.Table:
    """The timestamp and the columns of `metrics` (all when None); a segment reads only those columns."""
    if kind == PART:
        table = read_checked(source)
        names = table.column_names
    else:
        pf = pq.ParquetFile(source, page_checksum_verification=True)
        names = pf.schema_arrow.names
        table = None
    columns = None
    if metrics is not None:
        columns = [TIMESTAMP] + [n for n in names if n != TIMESTAMP and MetricKey.from_column(n).metric in metrics]
    if table is not None:
        table = table if columns is None else table.select(columns)
    else:
        table = pf.read(columns=columns)
    _check_columns(table)
    return table


def _check_columns(table: pa.Table) -> None:
    """A snapshot file's shape: an int64 timestamp and float columns named device/metric (a damaged footer can
    rename or retype a column: that is an unreadable file, not a new series)."""
    names = table.column_names
    if TIMESTAMP not in names or table.schema.field(TIMESTAMP).type != pa.int64():
        raise ValueError(f"not a system snapshots file: no int64 {TIMESTAMP} column")
    for field in table.schema:
        if field.name != TIMESTAMP and not (pa.types.is_floating(field.type) and "/" in field.name):
            raise ValueError(f"not a system snapshots file: column {field.name!r} ({field.type})")


def to_tidy(table: pa.Table, node: str, metrics: set[str] | None = None,
            start_us: int | None = None, end_us: int | None = None) -> pa.Table:
    """Wide file rows -> tidy rows (timestamp_us, node, device, metric, value), nulls dropped."""
    from stallwatch.records import system_schema

    schema = system_schema()
    ts = table.column(TIMESTAMP).to_numpy()
    keep = np.ones(len(ts), dtype=bool)
    if start_us is not None:
        keep &= ts >= start_us
    if end_us is not None:
        keep &= ts < end_us
    cols = [c for c in table.column_names if c != TIMESTAMP]
    keys = [MetricKey.from_column(c) for c in cols]
    if metrics is not None:
        picked = [(c, k) for c, k in zip(cols, keys) if k.metric in metrics]
        cols, keys = [c for c, _ in picked], [k for _, k in picked]
    n = int(keep.sum())
    if n == 0 or not cols:
        return schema.empty_table()
    ts = ts[keep]
    block = np.empty((n, len(cols)), dtype=np.float64)
    for j, (c, k) in enumerate(zip(cols, keys)):
        col = table.column(c).to_numpy(zero_copy_only=False)[keep].astype(np.float64)  # null -> NaN
        d = decimals_for(k.metric)
        block[:, j] = np.round(col, d) if d is not None else col  # float32 back to the stored resolution
    flat = block.reshape(-1)
    valid = ~np.isnan(flat)
    devices = sorted({k.device for k in keys})
    names = sorted({k.metric for k in keys})
    dev_idx = np.array([devices.index(k.device) for k in keys], dtype=np.int32)
    met_idx = np.array([names.index(k.metric) for k in keys], dtype=np.int32)
    return pa.Table.from_arrays([
        pa.array(np.repeat(ts, len(cols))[valid]),
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(int(valid.sum()), dtype=np.int32)), pa.array([node])),
        pa.DictionaryArray.from_arrays(pa.array(np.tile(dev_idx, n)[valid]), pa.array(devices)),
        pa.DictionaryArray.from_arrays(pa.array(np.tile(met_idx, n)[valid]), pa.array(names)),
        pa.array(flat[valid]),
    ], schema=schema)
