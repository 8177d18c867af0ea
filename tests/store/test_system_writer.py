"""SystemWriter on a real run directory: parts, segments, the storage cap and a sink that fails and recovers."""

from __future__ import annotations

import errno
import logging

import pyarrow as pa
import pytest

from stallwatch.records import MetricKey
from stallwatch.store import layout
from stallwatch.store.location import RunLocation
from stallwatch.store.system_codec import read_columns
from stallwatch.store.system_writer import SystemWriter

T0 = 1_763_790_000_000_000
S = 1_000_000  # one second in µs
KEYS = [MetricKey("cpu", "cpu_util"), MetricKey("memory", "mem_used_bytes")]


class FlakySink:
    """The real RunLocation, plus a switch that makes writes fail like a full disk (a fault injector)."""

    def __init__(self, location: RunLocation) -> None:
        self.location = location
        self.failing = False
        self.fail_deletes = False
        self.attempts = 0

    def write_atomic(self, rel: str, data: bytes) -> None:
        self.attempts += 1
        if self.failing:
            raise OSError(errno.ENOSPC, "No space left on device", rel)
        self.location.write_atomic(rel, data)

    def delete(self, rel: str) -> None:
        if self.fail_deletes:
            raise PermissionError(errno.EACCES, "Permission denied", rel)
        self.location.delete(rel)


@pytest.fixture(autouse=True)
def _stallwatch_log_reaches_caplog(monkeypatch):
    """The CLI's log setup (if some test ran it in this process) stops propagation, which caplog needs."""
    monkeypatch.setattr(logging.getLogger("stallwatch"), "propagate", True)


@pytest.fixture
def location(tmp_path) -> RunLocation:
    return RunLocation(str(tmp_path / "run"))


def _writer(sink, *, interval_s: float = 1, flush_s: float = 5, segment_s: float = 600,
            max_bytes: int = 1 << 30) -> SystemWriter:
    return SystemWriter(sink, "n1", KEYS, interval_us=int(interval_s * S), flush_interval_us=int(flush_s * S),
                        max_bytes=max_bytes, segment_us=int(segment_s * S))


def _values(i: int) -> list[float]:
    return [float(i % 100), float(1000 + i)]


def _feed(writer: SystemWriter, first: int, count: int, *, tick: bool = True) -> list[int]:
    """Append `count` snapshots one second apart, starting at second `first`; returns their timestamps."""
    out = []
    for i in range(first, first + count):
        ts = T0 + i * S
        writer.append(ts, _values(i))
        if tick:
            writer.tick(ts)
        out.append(ts)
    return out


def _files(location: RunLocation) -> list[layout.Chunk]:
    chunks = [layout.parse_chunk(e.path, e.size) for e in location.list(layout.SYSTEM_DIR)]
    assert all(c is not None for c in chunks), chunks
    return sorted(chunks, key=lambda c: (c.start_us, c.kind))


def _stored(location: RunLocation, chunks: list[layout.Chunk] | None = None) -> list[tuple[int, float, float]]:
    """Every stored row (timestamp, cpu, mem) of the given chunks (default: the live ones), in file order."""
    rows = []
    for c in layout.live_chunks(_files(location)) if chunks is None else chunks:
        t = read_columns(pa.OSFile(str(location.local_path(c.path))), c.kind, None).to_pydict()
        rows += list(zip(t["timestamp_us"], t["cpu/cpu_util"], t["memory/mem_used_bytes"]))
    return rows


def _expected(seconds) -> list[tuple[int, float, float]]:
    return [(T0 + i * S, *_values(i)) for i in seconds]


def test_flush_writes_one_part_with_the_pending_rows(location):
    """flush() writes exactly the unflushed rows as one part named by their time span."""
    w = _writer(location)
    _feed(w, 0, 3, tick=False)
    assert w.pending == 3
    w.flush()
    files = _files(location)
    assert [(c.kind, c.node, c.start_us, c.end_us) for c in files] == [("part", "n1", T0, T0 + 2 * S)]
    assert _stored(location) == _expected(range(3))
    assert w.pending == 0 and w.samples_written == 3
    assert w.stored_bytes == files[0].size
    w.flush()  # nothing new: no empty part
    assert len(_files(location)) == 1
    _feed(w, 3, 2, tick=False)
    w.flush()
    assert [(c.start_us, c.end_us) for c in _files(location)] == [(T0, T0 + 2 * S), (T0 + 3 * S, T0 + 4 * S)]
    assert _stored(location) == _expected(range(5))


def test_tick_flushes_once_the_flush_interval_has_passed(location):
    """tick() writes a part only when a flush interval has passed since the last one."""
    w = _writer(location, flush_s=5)
    _feed(w, 0, 5)  # seconds 0..4: not due yet
    assert _files(location) == []
    _feed(w, 5, 1)  # second 5: due
    assert [(c.kind, c.start_us, c.end_us) for c in _files(location)] == [("part", T0, T0 + 5 * S)]
    _feed(w, 6, 4)
    assert len(_files(location)) == 1


def test_rotation_writes_a_segment_and_deletes_its_parts(location):
    """At the segment boundary the parts are replaced by one segment holding the same rows."""
    w = _writer(location, flush_s=2, segment_s=10)
    _feed(w, 0, 10)
    parts = _files(location)
    assert len(parts) == 4 and {c.kind for c in parts} == {"part"}
    _feed(w, 10, 1)  # ten seconds after the first sample: rotate
    files = _files(location)
    assert [(c.kind, c.start_us, c.end_us) for c in files] == [("seg", T0, T0 + 10 * S)]
    assert _stored(location, files) == _expected(range(11))
    assert w.stored_bytes == files[0].size
    assert w.samples_written == 11 and w.pending == 0


def test_no_tiny_part_right_after_a_rotation(location):
    """The rotation counts as a flush: the next part comes a full flush interval later."""
    w = _writer(location, flush_s=2, segment_s=10)
    _feed(w, 0, 12)  # rotation at second 10, then second 11
    assert [c.kind for c in _files(location)] == ["seg"]
    assert w.pending == 1
    _feed(w, 12, 1)
    assert [(c.kind, c.start_us, c.end_us) for c in _files(location)] == [
        ("seg", T0, T0 + 10 * S), ("part", T0 + 11 * S, T0 + 12 * S)]


def test_close_leaves_every_sample_in_segments(location):
    """After close() the run holds only segments, and every appended sample exactly once."""
    w = _writer(location, flush_s=2, segment_s=10)
    _feed(w, 0, 27)
    w.close()
    files = _files(location)
    assert {c.kind for c in files} == {"seg"}
    assert len(files) == 3
    assert _stored(location, files) == _expected(range(27))
    assert w.samples_written == 27 and w.samples_dropped == 0
    assert w.stored_bytes == sum(c.size for c in files)


def test_names_cover_samples_when_the_clock_steps_back(location):
    """A file's name spans its earliest to latest sample even if timestamps go backwards."""
    w = _writer(location)
    w.append(T0 + 100 * S, _values(0))
    w.append(T0 + 40 * S, _values(1))  # wall clock stepped back
    w.append(T0 + 41 * S, _values(2))
    w.flush()
    (part,) = _files(location)
    assert (part.start_us, part.end_us) == (T0 + 40 * S, T0 + 100 * S)
    w.close()
    (seg,) = _files(location)
    assert (seg.kind, seg.start_us, seg.end_us) == ("seg", T0 + 40 * S, T0 + 100 * S)


def test_storage_cap_stops_writing_with_one_log_line(location, caplog):
    """Past the cap nothing more is written, the stored size stays under it, and it is said once."""
    probe = _writer(location)
    _feed(probe, 0, 5, tick=False)
    probe.flush()
    part_size = _files(location)[0].size
    location.delete(_files(location)[0].path)

    cap = int(part_size * 2.5)
    w = _writer(location, flush_s=5, segment_s=30, max_bytes=cap)
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        _feed(w, 0, 200)  # far past one segment and past the buffer's capacity
        w.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "storage cap" in warnings[0].getMessage()
    on_disk = sum(c.size for c in _files(location))
    assert 0 < on_disk <= cap
    assert w.stored_bytes == on_disk
    stored = _stored(location)
    assert stored == _expected(range(len(stored)))  # what was kept is the start, without gaps or repeats
    assert w.samples_written == len(stored)
    assert w.samples_written + w.samples_dropped == 200


def test_full_disk_keeps_samples_in_memory_and_writes_them_later(location, caplog):
    """ENOSPC: the rows stay buffered; once the disk has room one flush writes them, none lost or doubled."""
    sink = FlakySink(location)
    w = _writer(sink, flush_s=2, segment_s=60)
    _feed(w, 0, 3)  # part at second 2
    assert len(_files(location)) == 1
    sink.failing = True
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        _feed(w, 3, 10)  # several failed flushes
        failed_attempts = sink.attempts
        assert w.pending == 10
        assert len(_files(location)) == 1
        sink.failing = False
        w.flush()
    assert sink.attempts == failed_attempts + 1
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "No space left on device" in messages[0] and "stay in memory" in messages[0]
    assert "works again" in messages[1]
    assert w.pending == 0
    files = _files(location)
    assert [(c.start_us, c.end_us) for c in files] == [(T0, T0 + 2 * S), (T0 + 3 * S, T0 + 12 * S)]
    assert _stored(location) == _expected(range(13))
    w.close()
    assert [c.kind for c in _files(location)] == ["seg"]
    assert _stored(location) == _expected(range(13))
    assert w.samples_written == 13 and w.samples_dropped == 0


def test_failed_rotation_is_retried_and_compacts_everything(location):
    """A rotation that fails is retried on the next tick; the segment then replaces all parts."""
    sink = FlakySink(location)
    w = _writer(sink, flush_s=2, segment_s=10)
    _feed(w, 0, 9)
    sink.failing = True
    _feed(w, 9, 4)  # the rotation at second 10 fails, and again at 11 and 12
    assert {c.kind for c in _files(location)} == {"part"}
    sink.failing = False
    _feed(w, 13, 1)
    files = _files(location)
    assert [(c.kind, c.start_us, c.end_us) for c in files] == [("seg", T0, T0 + 13 * S)]
    assert _stored(location) == _expected(range(14))


def test_failed_rotation_with_everything_in_parts_keeps_the_parts(location):
    """When the segment cannot be written but every row is in parts, the parts stay and count once."""
    sink = FlakySink(location)
    w = _writer(sink, flush_s=2, segment_s=10)
    _feed(w, 0, 10)
    w.flush()
    sink.failing = True
    w.rotate()
    assert w.pending == 0
    sink.failing = False
    _feed(w, 10, 5)
    w.close()
    kinds = [c.kind for c in _files(location)]
    assert kinds.count("seg") == 1 and kinds.count("part") >= 1
    assert _stored(location) == _expected(range(15))


def test_leftover_parts_when_delete_fails_are_not_counted_twice(location):
    """If compacted parts cannot be deleted, the segment still wins and the data appears once."""
    sink = FlakySink(location)
    w = _writer(sink, flush_s=2, segment_s=10)
    sink.fail_deletes = True
    _feed(w, 0, 11)  # parts at seconds 2, 4, 6, 8; the segment at 10
    kinds = [c.kind for c in _files(location)]
    assert kinds.count("seg") == 1 and kinds.count("part") == 4
    assert _stored(location) == _expected(range(11))


def test_memory_stays_bounded_when_the_sink_fails_longer_than_a_segment(location, caplog):
    """A long outage drops old rows instead of growing; after recovery the kept rows land exactly once."""
    sink = FlakySink(location)
    w = _writer(sink, interval_s=1, flush_s=2, segment_s=10)
    capacity = 10 + 64  # one segment of samples plus the documented slack
    buffer = w._values
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        sink.failing = True
        for i in range(400):
            _feed(w, i, 1)
            assert w.pending <= capacity
        assert w._values is buffer and buffer.shape == (capacity, len(KEYS))
        assert w.samples_written == 0
        assert w.samples_dropped > 0
        assert w.samples_dropped + w.pending == 400
        kept = w.pending
        sink.failing = False
        w.close()
    assert any("dropped" in r.getMessage() for r in caplog.records)
    stored = _stored(location)
    assert stored == _expected(range(400 - kept, 400))  # the newest rows, each once
    assert w.samples_written == kept


def test_appending_the_wrong_number_of_values_raises_and_keeps_the_buffer(location):
    """A snapshot of the wrong shape is refused (the sampler catches it); earlier rows are intact."""
    w = _writer(location)
    _feed(w, 0, 2, tick=False)
    with pytest.raises(ValueError):
        w.append(T0 + 9 * S, [1.0, 2.0, 3.0])
    w.close()
    assert _stored(location)[:2] == _expected(range(2))


def test_a_live_interval_change_grows_the_buffer_and_keeps_every_row(location):
    """From a minute to 100 ms mid-segment (a live change): the rows buffered at the old pace stay, the buffer
    holds a whole segment at the new pace (no early rotation), and a flush is never due more often than a
    snapshot arrives."""
    w = _writer(location, interval_s=60, flush_s=5, segment_s=600)
    _feed(w, 0, 3)
    small = w._capacity
    w.set_interval(100_000)
    assert w._capacity > small and w._flush_us == 5 * S
    _feed(w, 3, 200, tick=False)  # more rows than the old buffer held
    w.close()
    assert [c.kind for c in _files(location)] == [layout.SEGMENT]
    assert _stored(location) == _expected(range(203))
    w2 = _writer(location, interval_s=1, flush_s=5)
    w2.set_interval(60 * S)
    assert w2._flush_us == 60 * S  # one flush per snapshot at most: no part per tick of an idle clock
