"""How framework events become files and back: one row per event; node and rank live in the path."""

from __future__ import annotations

import io
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stallwatch.records import framework_schema
from stallwatch.store.ipc_check import encode_checked, read_checked
from stallwatch.store.layout import PART

_TEXT = pa.dictionary(pa.int32(), pa.string())
STORED_SCHEMA = pa.schema([
    pa.field("pid", pa.int32()), pa.field("kind", _TEXT), pa.field("name", _TEXT), pa.field("mode", _TEXT),
    pa.field("step", pa.int64()), pa.field("start_us", pa.int64()), pa.field("end_us", pa.int64()),
    pa.field("args", pa.string()),
])


def encode(kind: str, columns: dict[str, list[Any]]) -> bytes:
    """A part (Arrow IPC, written every flush) or a segment (Parquet, zstd) of the given event columns."""
    table = pa.Table.from_arrays([
        pa.array(columns["pid"], pa.int32()),
        pa.array(columns["kind"], pa.string()).dictionary_encode(),
        pa.array(columns["name"], pa.string()).dictionary_encode(),
        pa.array(columns["mode"], pa.string()).dictionary_encode(),
        pa.array(columns["step"], pa.int64()),
        pa.array(columns["start_us"], pa.int64()),
        pa.array(columns["end_us"], pa.int64()),
        pa.array(columns["args"], pa.string()),
    ], schema=STORED_SCHEMA)
    if kind == PART:
        return encode_checked(table.schema, table.to_batches())
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_page_checksum=True,
                   column_encoding={"start_us": "DELTA_BINARY_PACKED", "end_us": "DELTA_BINARY_PACKED"},
                   use_dictionary=["kind", "name", "mode", "args", "pid", "step"])
    return sink.getvalue()


def read(source: Any, kind: str, columns: list[str] | None = None) -> pa.Table:
    """A stored file's rows: every column, or only `columns` (a segment then decodes only those). ValueError
    for a file whose columns are not the stored schema's (a damaged footer can rename or retype one)."""
    if kind == PART:
        table = read_checked(source)  # a flipped bit: ChecksumError, as a segment's page checksum
        table = table if columns is None else table.select(columns)
    else:
        # small files: threads cost more than they save; a page whose checksum fails is an error, not other values;
        # not read_table, whose dataset layer costs more than the decoding (3.4x the time on 1,000-event segments)
        table = pq.ParquetFile(source, page_checksum_verification=True).read(columns=columns, use_threads=False)
    for name in columns if columns is not None else STORED_SCHEMA.names:
        if name not in table.column_names or table[name].type != STORED_SCHEMA.field(name).type:
            raise ValueError(f"not a framework events file: its column {name!r} is missing or not "
                             f"{STORED_SCHEMA.field(name).type}")
    return table


def stored_columns(fields: Iterable[str] | None, kinds: bool, times: bool) -> list[str] | None:
    """The stored columns to read for the event fields `fields` (all when None), plus what the filters need."""
    if fields is None:
        return None
    need = set(fields) | ({"kind"} if kinds else set()) | ({"start_us", "end_us"} if times else set())
    return [c for c in STORED_SCHEMA.names if c in need]


def to_events(table: pa.Table, node: str, rank: str, kinds: set[str] | None,
              start_us: int | None, end_us: int | None, *, starting: bool = False,
              fields: Iterable[str] | None = None) -> pa.Table:
    """Stored rows -> `framework_schema()` rows that overlap [start_us, end_us) (with `starting`: that start
    in it) and are of `kinds`; only node, rank and `fields` when given."""
    schema = framework_schema()
    if fields is not None:
        wanted = {"node", "rank", *fields}
        schema = pa.schema([f for f in schema if f.name in wanted])
    if starting and table.num_rows and table["start_us"].null_count == 0:
        starts = table["start_us"].to_numpy()
        if bool((starts[1:] >= starts[:-1]).all()):  # as written: the slice is a contiguous run, cut without a copy
            lo = 0 if start_us is None else int(np.searchsorted(starts, start_us, side="left"))
            hi = len(starts) if end_us is None else int(np.searchsorted(starts, end_us, side="left"))
            table, start_us, end_us = table.slice(lo, max(hi - lo, 0)), None, None
    keep = np.ones(table.num_rows, dtype=bool)
    if start_us is not None:
        keep &= (table["start_us"].to_numpy() >= start_us) if starting else (table["end_us"].to_numpy() > start_us)
    if end_us is not None:
        keep &= table["start_us"].to_numpy() < end_us
    if kinds is not None:
        keep &= _is_in(table["kind"], kinds)
    if not keep.all():  # a filter copies every column: only when it removes something
        table = table.filter(pa.array(keep))
    n = table.num_rows
    rank_value = int(rank) if rank.lstrip("-").isdigit() else -1
    columns = {
        "node": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([node])),
        "rank": pa.array(np.full(n, rank_value, dtype=np.int32)),
    }
    out = []
    for field in schema:
        if field.name in columns:
            out.append(columns[field.name])
        else:
            out.append(_array(table[field.name], field.type) if n else pa.array([], field.type))
    return pa.Table.from_arrays(out, schema=schema)


def _is_in(column: pa.ChunkedArray, values: set[str]) -> np.ndarray:
    """Whether each row of a text column is one of `values`: through the dictionary when the column has one (a
    few entries looked up instead of every row cast to text)."""
    parts = []
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type) and chunk.null_count == 0:
            hit = np.array([v in values for v in chunk.dictionary.to_pylist()], bool)
            parts.append(hit[chunk.indices.to_numpy(zero_copy_only=False)])
        else:
            parts.append(pc.is_in(chunk.cast(pa.string()), pa.array(sorted(values), pa.string())).to_numpy(
                zero_copy_only=False))
    return np.concatenate(parts) if parts else np.zeros(0, bool)


def _array(column: pa.ChunkedArray, type_: pa.DataType) -> pa.Array:
    """One array of `type_` (no cast or copy when the stored column already is one)."""
    if column.type != type_:
        column = column.cast(type_)
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
