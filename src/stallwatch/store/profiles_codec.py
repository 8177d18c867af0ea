"""Profile summaries as files and back: per-operator (torch.profiler) and per-function (cProfile,
pyinstrument) totals of one window, stored as small Parquet files; node, rank and window live in the path."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

_TEXT = pa.dictionary(pa.int32(), pa.string())

# What operators.parquet holds: one row per (operator name, device).
OPERATORS_STORED = pa.schema([
    pa.field("operator", pa.string()), pa.field("device", _TEXT), pa.field("calls", pa.int64()),
    pa.field("self_us", pa.float64()), pa.field("total_us", pa.float64()),
])
# What functions.parquet holds: one row per Python function (name, file, line).
FUNCTIONS_STORED = pa.schema([
    pa.field("function", pa.string()), pa.field("file", pa.string()), pa.field("line", pa.int64()),
    pa.field("calls", pa.int64()), pa.field("self_us", pa.float64()), pa.field("total_us", pa.float64()),
])
_WHERE = [pa.field("node", _TEXT), pa.field("rank", pa.int32()), pa.field("window", pa.string())]


def operators_schema() -> pa.Schema:
    """`Run.operators()`: node, rank, window, then the stored operator columns."""
    return pa.schema(_WHERE + list(OPERATORS_STORED))


def functions_schema() -> pa.Schema:
    """`Run.functions()`: node, rank, window, then the stored function columns."""
    return pa.schema(_WHERE + list(FUNCTIONS_STORED))


def encode_operators(rows: list[dict[str, Any]]) -> bytes:
    """Rows of name, device, calls, self_us, total_us -> operators.parquet bytes."""
    return _encode(rows, OPERATORS_STORED)


def encode_functions(rows: list[dict[str, Any]]) -> bytes:
    """Rows of function, file, line, calls, self_us, total_us -> functions.parquet bytes."""
    return _encode(rows, FUNCTIONS_STORED)


def decode(source: Any, stored: pa.Schema) -> pa.Table:
    """A stored summary (bytes, a path or a file) as a table of `stored`'s columns, in its types."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = pa.BufferReader(source)
    table = pq.read_table(source, page_checksum_verification=True)
    return pa.Table.from_arrays([table[f.name].cast(f.type) for f in stored], schema=stored)


def with_window(table: pa.Table, schema: pa.Schema, node: str, rank: str, window: str) -> pa.Table:
    """Stored rows -> the reader's rows: node, rank and window (from the path) first."""
    n = table.num_rows
    rank_value = int(rank) if rank.lstrip("-").isdigit() else -1
    where = [
        pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array([node], pa.string())),
        pa.array([rank_value] * n, pa.int32()),
        pa.array([window] * n, pa.string()),
    ]
    return pa.Table.from_arrays(where + [table[f.name].combine_chunks() for f in table.schema], schema=schema)


def _encode(rows: list[dict[str, Any]], schema: pa.Schema) -> bytes:
    columns = []
    for f in schema:
        values = [r[f.name] for r in rows]
        columns.append(pa.array(values, pa.string()).dictionary_encode() if f.type == _TEXT
                       else pa.array(values, f.type))
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_arrays(columns, schema=schema), sink, compression="zstd",
                   write_page_checksum=True)
    return sink.getvalue()
