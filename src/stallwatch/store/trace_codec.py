"""Chrome-trace files (torch.profiler's `trace.json[.gz]`) read one event at a time: a trace can be
gigabytes of JSON, and a crafted one a gzip bomb, so nothing here holds more than one event (and a buffer)
in memory, and the bytes read are capped. The events are untrusted JSON values: callers check each one."""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from typing import IO, Any

MAX_TRACE_JSON_BYTES = 1 << 30  # decompressed; a bigger trace is refused (open it on its own)
MAX_VALUE_BYTES = 16 << 20  # one event, or one top-level field other than traceEvents
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class TraceError(ValueError):
    """A trace that cannot be read: not a Chrome trace, cut off, too large or too deep."""


def iter_events(raw: IO[bytes], *, top: dict[str, Any] | None = None,
                max_bytes: int = MAX_TRACE_JSON_BYTES) -> Iterator[Any]:
    """The elements of a Chrome trace's `traceEvents` array (or of a bare array), in file order, from a binary
    stream (gzipped or not). The trace's other top-level fields go into `top` (complete once the iteration
    ends: `baseTimeNanoseconds` usually comes after the events). TraceError past `max_bytes` of JSON."""
    head = raw.read(2)
    stream: IO[bytes] = raw
    if head == _GZIP_MAGIC:
        stream = gzip.GzipFile(fileobj=_Prefixed(head, raw), mode="rb")  # type: ignore[assignment]
        head = b""
    return _events(_Text(stream, head, max_bytes), {} if top is None else top)


def json_size(raw: IO[bytes], limit: int = MAX_TRACE_JSON_BYTES) -> int:
    """How many bytes of JSON a trace stream holds, counted while decompressing (the gzip trailer's size is
    the file's word, not a fact), stopping past `limit`: a bomb is refused in seconds, before any parsing."""
    head = raw.read(2)
    if head != _GZIP_MAGIC:
        size = len(head)
        while size <= limit and (chunk := raw.read(_CHUNK)):
            size += len(chunk)
        return size
    size = 0
    try:
        with gzip.GzipFile(fileobj=_Prefixed(head, raw), mode="rb") as gz:
            while size <= limit and (chunk := gz.read(_CHUNK)):
                size += len(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"the trace cannot be decompressed ({exc})") from None
    return size


def _events(text: _Text, top: dict[str, Any]) -> Iterator[Any]:
    first = text.peek()
    if first == "[":
        yield from _array(text)
    elif first == "{":
        text.take("{")
        found = False
        while True:
            if text.peek() == "}":
                text.take("}")
                break
            key = text.value()
            if not isinstance(key, str):
                raise TraceError("not a Chrome trace: an object key is not a string")
            text.take(":")
            if key == "traceEvents" and text.peek() == "[":
                found = True
                yield from _array(text)
            else:
                top[key] = text.value()
            if text.peek() == ",":
                text.take(",")
            elif text.peek() != "}":
                raise TraceError(f"not valid JSON near byte {text.offset}: ',' or '}}' expected")
        if not found:
            raise TraceError("not a Chrome trace (no traceEvents list)")
    else:
        raise TraceError("not a Chrome trace: neither a JSON object nor an array")
    if text.peek() != "":
        raise TraceError(f"not valid JSON: extra data after the trace at byte {text.offset}")


def _array(text: _Text) -> Iterator[Any]:
    text.take("[")
    if text.peek() == "]":
        text.take("]")
        return
    while True:
        yield text.value()
        c = text.peek()
        if c == ",":
            text.take(",")
        elif c == "]":
            text.take("]")
            return
        else:
            raise TraceError(f"not valid JSON near byte {text.offset}: ',' or ']' expected"
                             if c else "the trace is cut off (it ends inside the event list)")


class _Text:
    """UTF-8 text of a byte stream, decoded a chunk at a time; `value()` parses the next JSON value."""

    def __init__(self, stream: IO[bytes], head: bytes, max_bytes: int) -> None:
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._max = max_bytes
        self._read = 0
        self._eof = False
        self._buf = ""
        self._pos = 0
        self._consumed = 0  # characters dropped from the buffer's front
        if head:
            self._append(head)

    @property
    def offset(self) -> int:
        return self._consumed + self._pos

    def _append(self, data: bytes) -> None:
        self._read += len(data)
        if self._read > self._max:
            raise TraceError(f"the trace is larger than {self._max / 2**20:.0f} MB of JSON; open it on its own "
                             "(Perfetto, HTA)")
        try:
            text = self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise TraceError(f"not UTF-8 text ({exc.reason})") from None
        self._consumed += self._pos
        self._buf = self._buf[self._pos:] + text
        self._pos = 0

    def _fill(self) -> bool:
        """Read more; False at the end of the stream."""
        if self._eof:
            return False
        try:
            data = self._stream.read(_CHUNK)
        except (OSError, EOFError, zlib.error) as exc:  # a corrupt or truncated gzip stream
            raise TraceError(f"the trace cannot be decompressed ({exc})") from None
        if not data:
            self._eof = True
            self._append(b"")
            return False
        self._append(data)
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ('' at the end)."""
        while True:
            self._pos = _WHITESPACE.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf) or not self._fill():
                return self._buf[self._pos] if self._pos < len(self._buf) else ""

    def take(self, char: str) -> None:
        if self.peek() != char:
            raise TraceError(f"not valid JSON near byte {self.offset}: {char!r} expected"
                             if self.peek() else "the trace is cut off")
        self._pos += 1

    def value(self) -> Any:
        """The next JSON value, read on until it is complete (at most MAX_VALUE_BYTES)."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
                if end < len(self._buf) or self._eof:  # a number at the buffer's end may go on
                    self._pos = end
                    return value
            except json.JSONDecodeError as exc:
                if self._eof:
                    raise TraceError("the trace is cut off" if exc.pos >= len(self._buf)
                                     else f"not valid JSON near byte {self._consumed + exc.pos} ({exc.msg})") from None
            except RecursionError:
                raise TraceError(f"a value near byte {self.offset} nests too deeply") from None
            except ValueError as exc:  # an integer of thousands of digits
                raise TraceError(f"a value near byte {self.offset} cannot be read ({exc})") from None
            if len(self._buf) - self._pos > MAX_VALUE_BYTES:
                raise TraceError(f"a value near byte {self.offset} is larger than {MAX_VALUE_BYTES >> 20} MB "
                                 "(or not valid JSON)")
            self._fill()


class _Prefixed:
    """A stream with bytes already read put back in front (gzip needs its magic number)."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head, self._rest = head, rest

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            return self._rest.read(n)
        if n is None or n < 0:
            head, self._head = self._head, b""
            return head + self._rest.read()
        head, self._head = self._head[:n], self._head[n:]
        return head + (self._rest.read(n - len(head)) if n > len(head) else b"")
