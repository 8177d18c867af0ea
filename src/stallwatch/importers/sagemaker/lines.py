"""Reading a source file as blocks of whole lines, a few megabytes at a time, so memory stays bounded however
large the file (a SageMaker minute file or a trace file is read the same way, locally or from S3)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from stallwatch.store.location import RunLocation

BLOCK_BYTES = 16 * 2**20
MAX_LINE_BYTES = 64 * 2**20


def line_blocks(source: RunLocation, path: str, block_bytes: int = BLOCK_BYTES, max_line: int = MAX_LINE_BYTES,
                on_long_line: Callable[[], None] | None = None) -> Iterator[tuple[bytes, bool]]:
    """(block, last) pairs: each block holds whole lines (ending in a newline) except possibly the file's last
    one, which comes in the block marked last (a killed job's file may end in the middle of a line). A line
    longer than `max_line` is skipped (`on_long_line` is told): no real SageMaker line comes near it, and
    memory stays bounded."""
    with source.open_input_stream(path) as stream:
        carry = b""
        skipping = False  # inside a too-long line: drop bytes up to its newline
        ready: bytes | None = None  # whole lines held back until it is known whether more follow
        while True:
            chunk = stream.read(block_bytes)
            if not chunk:
                yield (ready or b"") + (b"" if skipping else carry), True
                return
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    continue
                chunk, skipping = chunk[nl + 1:], False
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # no newline yet: one long line, keep reading
                carry = data
                if len(carry) > max_line:
                    carry, skipping = b"", True
                    if on_long_line is not None:
                        on_long_line()
                continue
            if ready is not None:
                yield ready, False
            ready, carry = data[:cut], data[cut:]


def split_last_line(block: bytes) -> tuple[bytes, bytes]:
    """The block without its last non-blank line, and that line (to be parsed on its own: it is the one a
    killed writer leaves half-written)."""
    end = len(block.rstrip())
    start = block.rfind(b"\n", 0, end) + 1
    return block[:start], block[start:end]
