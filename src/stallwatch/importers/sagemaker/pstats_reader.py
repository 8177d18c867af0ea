"""cProfile's stats file (what `pstats.Stats.dump_stats` writes: a marshal-encoded dict) read without
`marshal`: the file comes from a bucket and marshal is not meant for untrusted bytes. Only what a stats dict
holds is accepted — dicts, tuples, strings, ints, floats — anything else (code objects among them) is refused."""

from __future__ import annotations

import struct
from typing import Any

MAX_DEPTH = 16  # a stats dict nests four deep (dict -> tuple -> callers dict -> tuple)
_FLAG_REF = 0x80


class StatsFormatError(ValueError):
    """The bytes are not a cProfile stats dict."""


def load_stats(data: bytes) -> dict[tuple[str, int, str], tuple]:
    """{(file, line, function): (primitive calls, calls, self s, cumulative s, callers)}."""
    reader = _Reader(data)
    value = reader.value(0)
    if not isinstance(value, dict):
        raise StatsFormatError("not cProfile stats: the file does not hold a dict")
    for key, entry in value.items():
        if not (isinstance(key, tuple) and len(key) == 3 and isinstance(entry, tuple) and len(entry) >= 4):
            raise StatsFormatError("not cProfile stats: an entry is not (file, line, function) -> (cc, nc, tt, ct, …)")
    return value


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.refs: list[Any] = []

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise StatsFormatError("truncated stats file")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int32(self) -> int:
        return struct.unpack("<i", self.take(4))[0]

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise StatsFormatError("stats nested too deep")
        code = self.take(1)[0]
        flag, code = code & _FLAG_REF, chr(code & ~_FLAG_REF)
        slot = None
        if flag:
            slot = len(self.refs)
            self.refs.append(None)
        value = self._decode(code, depth)
        if slot is not None:
            self.refs[slot] = value
        return value

    def _decode(self, code: str, depth: int) -> Any:
        if code == "N":
            return None
        if code == "T":
            return True
        if code == "F":
            return False
        if code == "i":
            return self.int32()
        if code == "l":  # arbitrary-size int: 15-bit digits, little end first
            n = self.int32()
            digits = struct.unpack(f"<{abs(n)}H", self.take(2 * abs(n))) if n else ()
            value = sum(d << (15 * i) for i, d in enumerate(digits))
            return -value if n < 0 else value
        if code == "g":
            return struct.unpack("<d", self.take(8))[0]
        if code == "f":  # old text float
            return float(bytes(self.take(self.take(1)[0])).decode("ascii"))
        if code in "uta":
            return bytes(self.take(self.int32())).decode("utf-8" if code in "ut" else "latin-1")
        if code == "A":
            return bytes(self.take(self.int32())).decode("latin-1")
        if code in "zZ":
            return bytes(self.take(self.take(1)[0])).decode("latin-1")
        if code == ")":
            return tuple(self.value(depth + 1) for _ in range(self.take(1)[0]))
        if code == "(":
            n = self.int32()
            if n < 0 or n > len(self.data):
                raise StatsFormatError("bad tuple size")
            return tuple(self.value(depth + 1) for _ in range(n))
        if code == "{":
            out: dict[Any, Any] = {}
            while True:
                if self.take(1)[0] == ord("0"):
                    return out
                self.pos -= 1
                key = self.value(depth + 1)
                try:
                    out[key] = self.value(depth + 1)
                except TypeError:
                    raise StatsFormatError("unhashable dict key") from None
        if code == "r":
            index = self.int32()
            if not 0 <= index < len(self.refs) or self.refs[index] is None:
                raise StatsFormatError("bad back-reference")
            return self.refs[index]
        raise StatsFormatError(f"type {code!r} has no place in cProfile stats")
