"""Chrome traces read one event at a time: the same events json.loads gives, in bounded memory, and a clear
TraceError for anything that is not a whole trace or is too big (a gzip bomb is refused before parsing)."""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc
import zlib

import pytest

from stallwatch.store.trace_codec import TraceError, iter_events, json_size


def _trace(n: int) -> dict:
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "x"}],
            "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 2,
                             "ts": 1000 + i * 10, "dur": 5, "args": {"i": i, "s": "ü\"]}"}} for i in range(n)]
                           + [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}}],
            "traceName": "t.json", "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def bomb(json_bytes: int) -> bytes:
    """A gzip of a valid-looking trace whose event list is `json_bytes` of whitespace (about 1000:1)."""
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [co.compress(b'{"traceEvents": [')]
    block = b" " * (1 << 20)
    for _ in range(json_bytes >> 20):
        parts.append(co.compress(block))
    parts += [co.compress(b"]}"), co.flush()]
    return b"".join(parts)


@pytest.mark.parametrize("gzipped", [False, True])
def test_the_events_and_the_other_fields_are_what_json_loads_gives(gzipped):
    doc = _trace(20_000)
    raw = json.dumps(doc, indent=1).encode()
    data = gzip.compress(raw) if gzipped else raw
    top: dict = {}
    assert list(iter_events(io.BytesIO(data), top=top)) == doc["traceEvents"]
    assert top == {k: v for k, v in doc.items() if k != "traceEvents"}  # baseTimeNanoseconds came last
    assert json_size(io.BytesIO(data)) == len(raw)


def test_a_bare_event_list_is_a_trace_too():
    assert list(iter_events(io.BytesIO(b' [ {"ph": "i"} , 3 , "x" ] '))) == [{"ph": "i"}, 3, "x"]


@pytest.mark.parametrize("data, words", [
    (b'{"traceEvents": [{"ph": "X", "ts": 1,', "cut off"),
    (b'{"traceEvents": [{"ph": "X"}', "cut off"),
    (b'{"traceEvents": [1 2]}', "',' or ']' expected"),
    (b'{"other": 1}', "no traceEvents list"),
    (b'"just a string"', "neither a JSON object nor an array"),
    (b"", "neither a JSON object nor an array"),
    (b'{"traceEvents": []} trailing', "extra data"),
    (b'{"traceEvents": ["\xff"]}', "not UTF-8"),
    (b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", "nests too deeply"),
    (b'{"traceEvents": [' + b"1" * 5000 + b"]}", "cannot be read"),
    (gzip.compress(b'{"traceEvents": []}')[:-6], "cannot be decompressed"),
    (b"\x1f\x8bnot gzip at all", "cannot be decompressed"),
], ids=["cut-in-event", "cut-after-event", "no-comma", "no-events", "string", "empty", "trailing", "utf8", "deep",
        "5000-digits", "truncated-gzip", "bad-gzip"])
def test_anything_but_a_whole_trace_is_a_trace_error(data, words):
    with pytest.raises(TraceError) as err:
        list(iter_events(io.BytesIO(data)))
    assert words in str(err.value)


def test_one_event_larger_than_the_limit_is_refused():
    data = b'{"traceEvents": [{"name": "' + b"x" * (17 << 20) + b'"}]}'
    with pytest.raises(TraceError, match="larger than 16 MB"):
        list(iter_events(io.BytesIO(data)))


def test_a_gzip_bomb_is_refused_in_bounded_memory():
    """A 70 KB gzip that expands to 64 MB (a 0.5 MB one to 1.1 GB loaded whole took the timeline export to
    2.2 GB): counted and refused while decompressing, never held."""
    data = bomb(64 << 20)
    assert len(data) < 100_000
    tracemalloc.start()
    try:
        assert json_size(io.BytesIO(data), limit=32 << 20) > 32 << 20
        with pytest.raises(TraceError, match="larger than 32 MB"):
            list(iter_events(io.BytesIO(data), max_bytes=32 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 << 20, f"peak {peak / 2**20:.1f} MB"


def test_streaming_holds_one_event_at_a_time():
    raw = json.dumps(_trace(200_000)).encode()  # 25 MB of JSON
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_events(io.BytesIO(gzip.compress(raw, 1))))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 200_001
    assert peak < len(raw) / 3, f"peak {peak / 2**20:.1f} MB for {len(raw) / 2**20:.0f} MB of JSON"


# -- fuzzing: any bytes are events or one TraceError, never another exception, never a hang ----------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzz import JSON, fuzz, json_bytes  # noqa: E402

_EVENT = st.dictionaries(st.sampled_from(["ph", "ts", "dur", "name", "cat", "pid", "tid", "id", "args", "s"]),
                         JSON | st.sampled_from(["X", "M", "i", "s", "f", "C"]), max_size=8)
_DOCS = st.one_of(
    st.dictionaries(st.sampled_from(["traceEvents", "baseTimeNanoseconds", "schemaVersion", "x"]),
                    st.lists(_EVENT, max_size=6) | JSON, max_size=4),
    st.lists(_EVENT, max_size=6), JSON)


def _events_or_error(data: bytes, top: dict | None = None) -> list | None:
    try:
        return list(iter_events(io.BytesIO(data), top=top, max_bytes=1 << 20))
    except TraceError as exc:
        assert "\n" not in str(exc)
        return None


@fuzz(200)
@given(_DOCS, st.booleans())
def test_fuzz_json_documents_read_as_json_loads_reads_them(doc, gzipped):
    raw = json_bytes(doc)
    top: dict = {}
    got = _events_or_error(gzip.compress(raw) if gzipped else raw, top)
    try:
        expected = json.loads(raw)
    except ValueError:  # an integer past 4,300 digits: refused, as json refuses it
        assert got is None
        return
    if isinstance(expected, dict) and isinstance(expected.get("traceEvents"), list):
        assert got is not None and len(got) == len(expected["traceEvents"])
        assert set(top) == set(expected) - {"traceEvents"}
    elif isinstance(expected, list):
        assert got is not None and len(got) == len(expected)
    else:
        assert got is None


@fuzz(200)
@given(st.binary(max_size=300), st.booleans())
def test_fuzz_bytes(data, gzipped):
    _events_or_error(gzip.compress(data) if gzipped else data)
    try:
        json_size(io.BytesIO(data))
    except TraceError:
        pass


@fuzz(200)
@given(st.integers(0, 10_000), st.integers(1, 255), st.sampled_from(["flip", "truncate"]), st.booleans())
def test_fuzz_damaged_real_trace(where, bits, how, gzipped):
    raw = json.dumps(_trace(50)).encode()
    data = gzip.compress(raw) if gzipped else raw
    if how == "truncate":
        data = data[: where % len(data)]
    else:
        flipped = bytearray(data)
        flipped[where % len(data)] ^= bits
        data = bytes(flipped)
    _events_or_error(data)
