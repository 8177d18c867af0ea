"""Framework events in the store: FrameworkWriter -> framework/<node>/<rank>/ files -> Run.framework()."""

from __future__ import annotations

import logging
import shutil

import pytest

from stallwatch.records import FrameworkEvent, framework_schema
from stallwatch.store import layout
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run

T0 = 1_763_790_000_000_000
MS = 1000


def _steps(rank_pid: int, count: int, first_step: int = 0, mode: str = "TRAIN") -> list[FrameworkEvent]:
    """Each step 100 ms: a data wait, forward, backward and optimizer inside it."""
    events = []
    for i in range(first_step, first_step + count):
        t = T0 + i * 100 * MS
        events += [
            FrameworkEvent("step", "train_step", t, t + 90 * MS, mode, i, rank_pid),
            FrameworkEvent("data_wait", "DataLoader.__next__", t, t + 10 * MS, mode, i, rank_pid),
            FrameworkEvent("forward", "Net.forward", t + 10 * MS, t + 40 * MS, mode, i, rank_pid, '{"batch": 64}'),
            FrameworkEvent("backward", "backward", t + 40 * MS, t + 80 * MS, mode, i, rank_pid),
            FrameworkEvent("optimizer", "SGD.step", t + 80 * MS, t + 90 * MS, mode, i, rank_pid),
        ]
    return events


def _write(location: RunLocation, node: str, rank: int, events: list[FrameworkEvent], *, close: bool = True,
           **kw) -> FrameworkWriter:
    w = FrameworkWriter(location, node, rank, flush_interval_us=kw.pop("flush_us", 1_000_000),
                        max_bytes=kw.pop("max_bytes", 1 << 30), **kw)
    for e in events:
        w.append(e)
        w.tick(e.end_us)
    if close:
        w.close()
    return w


@pytest.fixture
def location(tmp_path) -> RunLocation:
    loc = RunLocation(str(tmp_path / "run"))
    loc.write_atomic(layout.RUN_JSON, b'{"run_id": "run"}')
    return loc


def test_round_trip_with_node_and_rank_from_the_path(location):
    _write(location, "algo-1", 0, _steps(100, 20))
    t = open_run(location.uri).framework()
    assert t.schema == framework_schema()
    assert t.num_rows == 100
    row = t.to_pylist()[2]
    assert row == {"node": "algo-1", "rank": 0, "pid": 100, "kind": "forward", "name": "Net.forward", "mode": "TRAIN",
                   "step": 0, "start_us": T0 + 10 * MS, "end_us": T0 + 40 * MS, "args": '{"batch": 64}'}
    assert sorted(set(t["kind"].to_pylist())) == ["backward", "data_wait", "forward", "optimizer", "step"]


def test_order_is_node_then_numeric_rank_then_time(location):
    for node in ("algo-2", "algo-1"):
        for rank in (10, 2):
            _write(location, node, rank, list(reversed(_steps(rank, 3))))
    t = open_run(location.uri).framework(kinds=["step"])
    keys = list(zip(t["node"].to_pylist(), t["rank"].to_pylist(), t["start_us"].to_pylist()))
    assert keys == sorted(keys)
    assert [r for _, r, _ in keys[:6]] == [2, 2, 2, 10, 10, 10]  # 10 after 2: numbers, not strings
    assert open_run(location.uri).ranks() == {"algo-1": ["2", "10"], "algo-2": ["2", "10"]}


def test_time_range_returns_events_that_overlap_it_and_kinds_filter(location):
    _write(location, "algo-1", 0, _steps(1, 10))
    run = open_run(location.uri)
    t = run.framework(start_us=T0 + 250 * MS, end_us=T0 + 500 * MS, kinds="forward")
    assert t["step"].to_pylist() == [3, 4]  # step 2's forward ended at 240 ms, step 5's starts at 510 ms
    steps = run.framework(start_us=T0 + 250 * MS, end_us=T0 + 500 * MS, kinds=["step"])
    assert steps["step"].to_pylist() == [2, 3, 4]  # step 2 (200-290 ms) overlaps the start of the range
    assert run.framework(nodes=["other"]).num_rows == 0


def test_events_outside_steps_have_no_step_number(location):
    _write(location, "algo-1", 0, [FrameworkEvent("collective", "all_reduce", T0, T0 + 5 * MS, "GLOBAL", None, 7)])
    row = open_run(location.uri).framework().to_pylist()[0]
    assert row["step"] is None and row["mode"] == "GLOBAL" and row["args"] == ""


def test_parts_while_running_then_one_segment_and_no_double_counting(location):
    w = _write(location, "algo-1", 0, _steps(1, 30), close=False, flush_us=500 * MS)
    files = [e.path for e in location.list("framework")]
    assert files and all(p.endswith(".arrow") for p in files)  # live: parts only
    assert 0 < w.pending < 150
    assert open_run(location.uri).framework().num_rows == 150 - w.pending  # what was flushed, not the buffer
    leftover = location.local_path(files[0])
    kept = leftover.with_name("kept")
    shutil.copy(leftover, kept)
    w.close()
    shutil.copy(kept, leftover)  # a crash between writing the segment and deleting this part
    kept.unlink()
    names = sorted(e.path.rsplit("/", 1)[1][:4] for e in location.list("framework"))
    assert names == ["part", "seg-"]
    assert open_run(location.uri).framework().num_rows == 150  # the leftover is skipped


def test_a_full_buffer_rotates_early_instead_of_growing(location):
    w = _write(location, "algo-1", 0, _steps(1, 50), close=False, capacity=40, flush_us=10**9)
    assert w.pending < 40
    assert any(e.path.endswith(".parquet") for e in location.list("framework"))
    w.close()
    assert open_run(location.uri).framework().num_rows == 250


def test_an_unreadable_file_is_skipped_with_one_warning(location, caplog):
    _write(location, "algo-1", 0, _steps(1, 5))
    _write(location, "algo-1", 1, _steps(2, 5))
    bad = [e.path for e in location.list("framework/algo-1/1")][0]
    location.write_atomic(bad, b"not parquet at all")
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    run = open_run(location.uri)
    assert run.framework().num_rows == 25
    assert run.framework().num_rows == 25
    said = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(said) == 1 and bad in said[0]


def test_no_framework_data_gives_an_empty_table_with_the_schema(location):
    t = open_run(location.uri).framework()
    assert t.num_rows == 0 and t.schema == framework_schema()
