"""Checksums for the Arrow IPC parts (written every flush until their segment replaces them), as Parquet segments
have page checksums: a flipped bit in a part is a read error naming the file, never a silently different value
(one flipped bit changed a pid from 14047 to 145119), and damaged bytes are never decoded.

The CRC32 covers the whole file, its footer included (with the checksum's own 8 hex digits read as a fixed
placeholder), and is kept in the footer's custom metadata under `CRC_KEY`; a reader checks it before decoding
any batch, then validates the batches fully. Other Arrow readers read the file as it is. Parts written before
this key existed are read unchecked (validated only)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pyarrow as pa

CRC_KEY = b"stallwatch.crc32"
_PLACEHOLDER = b"crc32???"  # the checksum's 8 hex digits while it is computed (and when it is checked)
_MAGIC = b"ARROW1"
_TRAILER = 4 + len(_MAGIC)  # the footer's length (int32, little-endian), then the magic


class ChecksumError(ValueError):
    """The part's bytes are not what was written (a flipped bit, a damaged disk or transfer)."""


def encode_checked(schema: pa.Schema, batches: list[pa.RecordBatch]) -> bytes:
    """An Arrow IPC file of `batches` whose footer carries the checksum of the whole file (with the checksum's own
    8 digits read as `_PLACEHOLDER`)."""
    data = _write(schema, batches, _PLACEHOLDER)
    at = data.rindex(_PLACEHOLDER, _body_end(data))
    return data[:at] + f"{zlib.crc32(data):08x}".encode() + data[at + len(_PLACEHOLDER):]


def read_checked(source: Any) -> pa.Table:
    """The part's rows; ChecksumError when its bytes are not what was written, ValueError for a file that is no
    Arrow IPC file or whose batches are not valid. No batch is decoded before the checksum holds."""
    data = source.read() if hasattr(source, "read") else bytes(source)
    end = _body_end(data)
    reader = pa.ipc.open_file(pa.BufferReader(data))
    want = (reader.metadata or {}).get(CRC_KEY)
    if want is not None:
        at = data.rfind(want, end)
        if len(want) != len(_PLACEHOLDER) or at < 0 or f"{zlib.crc32(data[:at] + _PLACEHOLDER + data[at + len(want):]):08x}".encode() != want:
            raise ChecksumError("its checksum does not match its bytes (damaged)")
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    for batch in batches:
        batch.validate(full=True)
    return pa.Table.from_batches(batches, schema=reader.schema)


def _write(schema: pa.Schema, batches: list[pa.RecordBatch], crc: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema, metadata={CRC_KEY: crc}) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _body_end(data: bytes) -> int:
    """Where the footer starts (the trailer says its length); ValueError for what is no Arrow IPC file."""
    if len(data) < 2 * len(_MAGIC) + _TRAILER or data[-len(_MAGIC):] != _MAGIC or data[:len(_MAGIC)] != _MAGIC:
        raise ValueError("not an Arrow IPC file (no magic at its ends)")
    (footer,) = struct.unpack("<i", data[-_TRAILER:-len(_MAGIC)])
    end = len(data) - _TRAILER - footer
    if footer <= 0 or end < len(_MAGIC):
        raise ValueError("not an Arrow IPC file (its footer's length is out of range)")
    return end
