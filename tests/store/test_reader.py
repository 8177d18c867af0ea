"""Reading a real local run: metadata, tidy system tables, time ranges, damaged files, live tails."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import stallwatch
from stallwatch.records import MetricKey, system_schema
from stallwatch.store import layout
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import Run, RunNotFoundError, open_run
from tests.run_builder import KEYS, S, T0, NodeData, all_rows, feed, make_run, node_record, run_record, \
    write_node_json, writer_for


def _rows(table: pa.Table) -> list[tuple]:
    d = table.to_pydict()
    return sorted(zip(d["timestamp_us"], d["node"], d["device"], d["metric"], d["value"]))


def _chunks(root: Path, kind: str | None = None, node: str | None = None) -> list[layout.Chunk]:
    loc = RunLocation(str(root))
    out = [layout.parse_chunk(e.path, e.size) for e in loc.list(layout.SYSTEM_DIR)]
    return sorted((c for c in out if c and (kind is None or c.kind == kind) and (node is None or c.node == node)),
                  key=lambda c: (c.node, c.start_us))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "stallwatch" and r.levelno >= logging.WARNING]


@pytest.fixture(autouse=True)
def _stallwatch_log_reaches_caplog(monkeypatch):
    """The CLI's log setup (if some test ran it in this process) stops propagation, which caplog needs."""
    monkeypatch.setattr(logging.getLogger("stallwatch"), "propagate", True)


@pytest.fixture
def run_dir(tmp_path) -> tuple[Path, dict[str, NodeData]]:
    root = tmp_path / "20261122-060000-abc123"
    return root, make_run(root, seconds=30, offsets_s=(0, 3))


class DelayedLocation:
    """The real RunLocation; after one listing of system/ it runs `hook` (a compaction that races the read)."""

    def __init__(self, real: RunLocation, hook) -> None:
        self._real = real
        self.hook = hook

    def list(self, rel_dir: str, recursive: bool = True):
        out = self._real.list(rel_dir, recursive)
        if rel_dir == layout.SYSTEM_DIR and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return out

    def __getattr__(self, name):
        return getattr(self._real, name)


class HalfDeletingSink:
    """The real RunLocation whose deletes are held back after the first one (a compaction caught midway)."""

    def __init__(self, real: RunLocation) -> None:
        self.real = real
        self.held: list[str] = []

    def write_atomic(self, rel: str, data: bytes) -> None:
        self.real.write_atomic(rel, data)

    def delete(self, rel: str) -> None:
        if self.held or rel != self.first:
            self.held.append(rel)
        else:
            self.real.delete(rel)
            self.first = None

    def release(self) -> None:
        for rel in self.held:
            self.real.delete(rel)
        self.held = []


# -- metadata -------------------------------------------------------------------------------------------

def test_info_merges_run_json_and_every_node(run_dir):
    """info carries run.json's fields, each node's record, and the span over all nodes."""
    root, nodes = run_dir
    info = open_run(str(root)).info
    assert info["run_id"] == root.name
    assert info["command"] == ["python", "train.py", "--epochs", "1"]
    assert sorted(info["nodes"]) == ["algo-1", "algo-2"]
    assert info["nodes"]["algo-2"]["cpu_cores_logical"] == 2
    assert info["nodes"]["algo-2"]["start_us"] == T0 + 3 * S
    assert info["start_us"] == T0
    assert info["end_us"] == nodes["algo-2"].timestamps[-1] + S // 2


def _single_node_run(tmp_path):
    """A run with one node "a" and its writer, before any sample: (root, location, NodeData, writer)."""
    root = tmp_path / "run"
    loc = RunLocation(str(root))
    loc.write_atomic(layout.RUN_JSON, json.dumps(run_record("run", "a", T0)).encode())
    return root, loc, NodeData("a"), writer_for(loc, "a")


def test_info_end_from_data_when_a_node_died(tmp_path):
    """A node without end_us (its sampler was killed) ends at its newest stored sample."""
    root, loc, data, w = _single_node_run(tmp_path)
    feed(w, data, 0, 0, 7)  # parts only: killed before closing
    write_node_json(loc, node_record("a", T0, None, samples=0, finished=False))
    info = open_run(str(root)).info
    assert info["nodes"]["a"]["end_us_from_data"] == T0 + 6 * S
    assert info["end_us"] == T0 + 6 * S
    assert info["start_us"] == T0


def test_info_survives_bad_json(tmp_path, caplog):
    """A damaged node record is skipped with a warning; run.json that is not an object is ignored."""
    root = tmp_path / "run"
    loc = RunLocation(str(root))
    loc.write_atomic(layout.RUN_JSON, b"[1, 2]")
    write_node_json(loc, node_record("good", T0, T0 + S, samples=1))
    loc.write_atomic(layout.node_json("bad"), b'{"node": "bad", ')
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        info = open_run(str(root)).info
    assert list(info["nodes"]) == ["good"]
    assert info["start_us"] == T0
    warnings = _warnings(caplog)
    assert len(warnings) == 2
    assert any("nodes/bad.json" in w for w in warnings) and any("run.json" in w for w in warnings)


def test_nodes_ranks_and_keys(run_dir):
    """nodes lists every node, ranks come from framework/, system_keys from the newest file's columns."""
    root, _ = run_dir
    for rank in ("10", "2", "0"):
        p = root / "framework" / "algo-1" / rank / "steps.parquet"
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x")
    write_node_json(RunLocation(str(root)), node_record("algo-3", T0, T0, samples=0))  # no data yet
    run = open_run(str(root))
    assert run.nodes == ["algo-1", "algo-2", "algo-3"]
    assert run.ranks() == {"algo-1": ["0", "2", "10"]}
    assert run.system_keys("algo-1") == KEYS
    assert run.system_keys("algo-3") == []


def test_not_a_run(tmp_path):
    """Opening a directory that holds no run (or nothing at all) is a RunNotFoundError saying what to pass."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hi")
    for path in (tmp_path / "empty", tmp_path / "missing", tmp_path / "empty" / "notes.txt"):
        with pytest.raises(RunNotFoundError) as err:
            open_run(str(path))
        assert str(path) in str(err.value)
        assert "run directory itself" in str(err.value)
    assert issubclass(RunNotFoundError, FileNotFoundError)


def test_a_run_with_only_a_node_record_opens(tmp_path):
    """A run whose run.json is not there yet (remote spool) still opens from its node records."""
    root = tmp_path / "run"
    write_node_json(RunLocation(str(root)), node_record("a", T0, None, samples=0, finished=False))
    run = stallwatch.open_run(str(root))
    assert isinstance(run, Run)
    assert run.nodes == ["a"]
    assert run.system().num_rows == 0 and run.system().schema == system_schema()


# -- system tables --------------------------------------------------------------------------------------

def test_system_returns_every_row_once_with_the_schema(run_dir):
    """system() is the tidy table of all planted values of all nodes, NaN cells absent."""
    root, nodes = run_dir
    t = open_run(str(root)).system()
    assert t.schema == system_schema()
    assert _rows(t) == all_rows(nodes)
    assert len(_chunks(root, "part")) == 0 and len(_chunks(root, "seg")) == 6


def test_time_range_is_start_inclusive_end_exclusive(run_dir):
    """[start_us, end_us) across file boundaries: rows at start are in, rows at end are out."""
    root, nodes = run_dir
    start, end = T0 + 9 * S, T0 + 21 * S  # crosses segment boundaries of both nodes
    t = open_run(str(root)).system(start_us=start, end_us=end)
    expected = [r for r in all_rows(nodes) if start <= r[0] < end]
    assert _rows(t) == expected
    assert min(r[0] for r in expected) == start and max(r[0] for r in expected) == end - S
    assert _rows(open_run(str(root)).system(start_us=T0 + 32 * S)) == \
        [r for r in all_rows(nodes) if r[0] >= T0 + 32 * S]
    empty = open_run(str(root)).system(start_us=T0 + 500 * S)
    assert empty.num_rows == 0 and empty.schema == system_schema()


def test_node_and_metric_filters(run_dir):
    """nodes= and metrics= select rows; a single name may be given as a plain string."""
    root, nodes = run_dir
    run = open_run(str(root))
    only_2 = run.system(nodes=["algo-2"])
    assert _rows(only_2) == sorted(nodes["algo-2"].rows)
    util = run.system(metrics=["cpu_util", "gpu_util"])
    assert _rows(util) == [r for r in all_rows(nodes) if r[3] in ("cpu_util", "gpu_util")]
    assert {r[2] for r in _rows(util)} == {"cpu", "cpu0", "cpu1", "gpu0", "proc"}
    both = run.system(nodes="algo-1", metrics="mem_used_bytes", start_us=T0, end_us=T0 + 2 * S)
    assert _rows(both) == [(T0, "algo-1", "memory", "mem_used_bytes", float(2**30)),
                           (T0 + S, "algo-1", "memory", "mem_used_bytes", float(2**30 + 4096))]
    assert run.system(nodes=["nope"]).num_rows == 0
    assert run.system(metrics=[]).num_rows == 0


def test_reads_only_the_files_a_time_range_needs(run_dir, caplog):
    """A corrupt file outside the range is never opened: no warning, and the answer is complete."""
    root, nodes = run_dir
    first_seg = _chunks(root, "seg", "algo-1")[0]  # seconds 0..10
    (root / first_seg.path).write_bytes(b"PAR1 this is not parquet at all PAR1")
    start, end = T0 + 11 * S, T0 + 25 * S
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        t = open_run(str(root)).system(start_us=start, end_us=end)
    assert _warnings(caplog) == []
    assert _rows(t) == [r for r in all_rows(nodes) if start <= r[0] < end]


def test_a_corrupt_file_inside_the_range_is_skipped_with_one_warning(run_dir, caplog):
    """A truncated file in range costs only its own rows and is named in exactly one warning."""
    root, nodes = run_dir
    victim = _chunks(root, "seg", "algo-1")[1]  # seconds 11..21
    data = (root / victim.path).read_bytes()
    (root / victim.path).write_bytes(data[: len(data) // 2])
    run = open_run(str(root))
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        t = run.system()
        again = run.system(start_us=T0 + 12 * S)
    warnings = _warnings(caplog)
    assert len(warnings) == 1
    assert victim.path in warnings[0] and str(root) in warnings[0]
    lost = {(ts, "algo-1") for ts in range(victim.start_us, victim.end_us + 1, S)}
    expected = [r for r in all_rows(nodes) if (r[0], r[1]) not in lost]
    assert _rows(t) == expected
    assert _rows(again) == [r for r in expected if r[0] >= T0 + 12 * S]
    ov = run.system_overview()["algo-1"]
    assert ov.unreadable == 1 and ov.files == 2


def test_leftover_parts_covered_by_a_segment_are_not_double_counted(tmp_path):
    """Parts left behind by a crash after compaction are ignored; parts of the next segment are read."""
    root, loc, data, w = _single_node_run(tmp_path)
    feed(w, data, 0, 0, 10)
    saved = {c.path: (root / c.path).read_bytes() for c in _chunks(root, "part")}
    assert len(saved) == 4
    feed(w, data, 0, 10, 5)  # rotation at second 10 deletes the parts; then parts of the next segment
    for rel, blob in saved.items():  # as if the deletes never happened
        (root / rel).write_bytes(blob)
    kinds = [c.kind for c in _chunks(root)]
    assert kinds.count("seg") == 1 and kinds.count("part") == 4 + 2
    run = open_run(str(root))
    assert _rows(run.system()) == sorted(data.rows)
    assert run.system_overview()["a"].snapshots == 15


def test_system_lists_again_when_a_part_is_compacted_mid_read(tmp_path):
    """Parts that vanish between listing and reading are found in the new segment, not lost."""
    root = tmp_path / "run"
    loc = RunLocation(str(root))
    loc.write_atomic(layout.RUN_JSON, json.dumps(run_record("run", "a", T0)).encode())
    data = NodeData("a")
    sink = HalfDeletingSink(loc)
    w = writer_for(sink, "a")
    feed(w, data, 0, 0, 10)
    sink.first = _chunks(root, "part")[0].path
    run = open_run(str(root))
    run.location = DelayedLocation(loc, w.rotate)
    assert _rows(run.system()) == sorted(data.rows)


# -- live tail ------------------------------------------------------------------------------------------

def test_tail_returns_only_new_rows_while_data_is_written(tmp_path):
    """Each read() returns exactly the rows written since the previous one, across parts and rotations."""
    root = tmp_path / "run"
    loc = RunLocation(str(root))
    write_node_json(loc, node_record("a", T0, None, samples=0, finished=False))
    data = NodeData("a")
    w = writer_for(loc, "a", flush_s=2, segment_s=10)
    tail = open_run(str(root)).tail_system()
    seen: list[tuple] = []
    first = tail.read()
    assert first.num_rows == 0 and first.schema == system_schema()
    for step in range(6):  # 4 seconds per step: flushes and two rotations happen in between reads
        before = len(data.rows)
        feed(w, data, 0, step * 4, 4)
        w.flush()
        got = _rows(tail.read())
        assert got == sorted(data.rows[before:])
        seen += got
    assert tail.read().num_rows == 0
    w.close()  # compaction rewrites everything already read: nothing comes again
    assert tail.read().num_rows == 0
    assert sorted(seen) == sorted(data.rows)


def test_tail_filters(run_dir):
    """A tail with nodes= and metrics= returns only those rows."""
    root, nodes = run_dir
    tail = open_run(str(root)).tail_system(nodes="algo-2", metrics=["gpu_util"])
    assert _rows(tail.read()) == sorted(r for r in nodes["algo-2"].rows if r[3] == "gpu_util")
    assert tail.read().num_rows == 0


def test_tail_does_not_skip_rows_of_a_part_compacted_mid_read(tmp_path):
    """When a listed part vanishes but a later one is still there, the tail waits for the segment."""
    root = tmp_path / "run"
    loc = RunLocation(str(root))
    write_node_json(loc, node_record("a", T0, None, samples=0, finished=False))
    data = NodeData("a")
    sink = HalfDeletingSink(loc)
    w = writer_for(sink, "a")
    feed(w, data, 0, 0, 10)
    sink.first = _chunks(root, "part")[0].path
    run = open_run(str(root))
    tail = run.tail_system()
    run.location = DelayedLocation(loc, w.rotate)
    got = _rows(tail.read())
    sink.release()  # the compaction finishes
    got += _rows(tail.read())
    assert sorted(got) == sorted(data.rows)


# -- overview -------------------------------------------------------------------------------------------

def test_system_overview(run_dir):
    """Per node: snapshots, files, bytes and span, from the file footers."""
    root, nodes = run_dir
    ov = open_run(str(root)).system_overview()
    assert sorted(ov) == ["algo-1", "algo-2"]
    for name, data in nodes.items():
        chunks = _chunks(root, node=name)
        assert ov[name].snapshots == 30
        assert ov[name].files == len(chunks) == 3
        assert ov[name].bytes == sum(c.size for c in chunks) > 0
        assert ov[name].start_us == data.timestamps[0]
        assert ov[name].end_us == data.timestamps[-1]
        assert ov[name].unreadable == 0


def test_copied_run_reads_the_same(run_dir, tmp_path):
    """A run is just its directory: a copy elsewhere reads identically (no absolute paths inside)."""
    root, nodes = run_dir
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(root, copy)
    assert _rows(open_run(str(copy)).system()) == all_rows(nodes)
    assert open_run(f"file://{copy}").system().num_rows == len(all_rows(nodes))


def test_metric_key_columns_match_the_writer():
    """The reader's column naming is the writer's: device/metric."""
    assert MetricKey.from_column("gpu0/gpu_util") == MetricKey("gpu0", "gpu_util")
    assert [k.column for k in KEYS][:2] == ["cpu/cpu_util", "cpu/cpu_iowait"]


# -- the local RunLocation under the reader ---------------------------------------------------------------

def test_location_write_list_read_delete(tmp_path):
    """Atomic writes create folders and leave no temporary file; list() gives run-relative paths and sizes."""
    loc = RunLocation(f"{tmp_path}/run/")
    assert loc.uri == f"{tmp_path}/run" and not loc.remote
    assert loc.list("system") == []  # a folder that does not exist yet
    loc.write_atomic("system/a/x.parquet", b"12345")
    loc.write_atomic("run.json", b"{}")
    loc.write_atomic("run.json", b'{"v": 2}')  # replaced whole
    (tmp_path / "run" / "system" / "a" / ".hidden").write_bytes(b"h")
    (tmp_path / "run" / "system" / "a" / "y.parquet.1234abcd.tmp").write_bytes(b"t")
    assert sorted((e.path, e.size) for e in loc.list("")) == [("run.json", 8), ("system/a/x.parquet", 5)]
    assert [e.path for e in loc.list("system", recursive=False)] == []
    assert loc.read("run.json") == b'{"v": 2}'
    assert loc.exists("system/a/x.parquet") and not loc.exists("nope")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.json", "system"]
    loc.delete("system/a/x.parquet")
    loc.delete("system/a/x.parquet")  # deleting what is gone is fine
    assert not loc.exists("system/a/x.parquet")
    assert loc.local_path("run.json") == tmp_path / "run" / "run.json"
    with pytest.raises(FileNotFoundError):
        loc.read("missing.json")


def test_location_create_exclusive_never_overwrites(tmp_path):
    """create_exclusive writes once; a second writer gets False and the first content stays."""
    loc = RunLocation(str(tmp_path / "run"))
    assert loc.create_exclusive("nodes/a.json", b"first") is True
    assert loc.create_exclusive("nodes/a.json", b"second") is False
    assert loc.read("nodes/a.json") == b"first"
    assert [p.name for p in (tmp_path / "run" / "nodes").iterdir()] == ["a.json"]  # no temporary left


def test_location_writes_never_leave_the_run(tmp_path):
    """A directory link inside a run (`rules -> /etc`) made `stallwatch rules` write there; writes, creates
    and deletes now stay inside the run's real directory. A run reached through a link the user names works."""
    import os

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.json").write_text("mine")
    root = tmp_path / "run"
    root.mkdir()
    os.symlink(outside, root / "rules")
    loc = RunLocation(str(root))
    with pytest.raises(OSError, match="outside the run"):
        loc.write_atomic("rules/CPUBottleneck.json", b"{}")
    with pytest.raises(OSError, match="outside the run"):
        loc.create_exclusive("rules/new.json", b"{}")
    with pytest.raises(OSError, match="outside the run"):
        loc.delete("rules/keep.json")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.json"]
    os.symlink(root, tmp_path / "latest")
    RunLocation(str(tmp_path / "latest")).write_atomic("nodes/n.json", b"{}")
    assert (root / "nodes" / "n.json").read_bytes() == b"{}"


def test_location_file_uri_and_unsupported_scheme(tmp_path):
    """file:// URIs are local paths; other schemes than s3 are refused with a hint."""
    loc = RunLocation(f"file://{tmp_path}/r")
    loc.write_atomic("a.txt", b"x")
    assert (tmp_path / "r" / "a.txt").read_bytes() == b"x"
    with pytest.raises(ValueError, match="unsupported run location"):
        RunLocation("gs://bucket/run")


def test_system_wide_is_the_tidy_table_before_it_is_made_tidy(run_dir):
    """system_wide: a row per snapshot, a column per device/metric; the same values as system()."""
    root, _ = run_dir
    run = open_run(str(root))
    wide = run.system_wide("algo-1")
    tidy = run.system(nodes=["algo-1"])
    ts = wide.column("timestamp_us").to_pylist()
    assert ts == sorted(set(tidy.column("timestamp_us").to_pylist()))  # every snapshot once, in order
    rebuilt = {}
    for name in wide.column_names[1:]:
        device, metric = name.split("/")
        for t, v in zip(ts, wide.column(name).to_pylist()):
            if v is not None and v == v:
                rebuilt[(t, device, metric)] = v
    expected = {(r["timestamp_us"], r["device"], r["metric"]): r["value"] for r in tidy.to_pylist()}
    assert rebuilt.keys() == expected.keys()
    assert all(abs(rebuilt[k] - expected[k]) <= 1e-6 * max(1.0, abs(expected[k])) for k in expected)


def test_system_wide_filters_time_and_metrics(run_dir):
    root, _ = run_dir
    run = open_run(str(root))
    ts = run.system_wide("algo-1").column("timestamp_us").to_pylist()
    part = run.system_wide("algo-1", start_us=ts[5], end_us=ts[9], metrics=["cpu_util"])
    assert part.column("timestamp_us").to_pylist() == ts[5:9]
    assert part.column_names[0] == "timestamp_us"
    assert part.column_names[1:] and all(n.endswith("/cpu_util") for n in part.column_names[1:])
    assert run.system_wide("no-such-node").num_rows == 0


# -- hostile run directories: every reader survives them ---------------------------------------------------------

def _flip_silently(path: Path, column: str) -> int:
    """Flip one bit inside `column`'s pages of a Parquet file so that a reader that does not check page
    checksums returns other values without an error (a bit rotted on disk); returns the byte offset."""
    import io

    import pyarrow.parquet as pq

    data = path.read_bytes()
    original = pq.read_table(io.BytesIO(data))
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    chunk = meta.row_group(0).column(names.index(column))
    for offset in range(chunk.data_page_offset + chunk.total_compressed_size - 1, chunk.data_page_offset, -1):
        flipped = bytearray(data)
        flipped[offset] ^= 0x04
        try:
            changed = not pq.read_table(io.BytesIO(bytes(flipped))).equals(original)
        except Exception:  # this flip breaks decoding: not a silent one
            continue
        if changed:
            path.write_bytes(bytes(flipped))
            return offset
    raise AssertionError(f"no silent flip found in {path}:{column}")


def test_a_flipped_bit_in_a_segment_is_reported_and_skipped(run_dir, caplog):
    """Parquet pages carry CRC32 checksums, checked on read: a flipped bit made values change without a
    word; now the file is named in one warning and skipped, and every other file still reads."""
    root, nodes = run_dir
    victim = _chunks(root, "seg", "algo-1")[1]
    _flip_silently(root / victim.path, "memory/mem_used_bytes")
    run = open_run(str(root))
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        t = run.system()
    (warning,) = _warnings(caplog)
    assert victim.path in warning and "checksum" in warning.lower(), warning
    lost = {(ts, "algo-1") for ts in range(victim.start_us, victim.end_us + 1, S)}
    assert _rows(t) == [r for r in all_rows(nodes) if (r[0], r[1]) not in lost]  # nothing else changed


def test_a_flipped_bit_in_a_framework_segment_is_reported_and_skipped(tmp_path, caplog):
    from stallwatch.records import FrameworkEvent
    from stallwatch.store.framework_writer import FrameworkWriter

    root = tmp_path / "run"
    make_run(root, nodes=("algo-1",), seconds=5)
    location = RunLocation(str(root))
    for rank in (0, 1):
        w = FrameworkWriter(location, "algo-1", rank, flush_interval_us=600 * S, max_bytes=1 << 30)
        for i in range(500):
            w.append(FrameworkEvent("step", "train_step", T0 + i * 10_000, T0 + i * 10_000 + 9_000, "TRAIN", i, 7))
        w.close()
    (victim,) = (root / "framework" / "algo-1" / "1").glob("seg-*.parquet")
    _flip_silently(victim, "end_us")
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        events = open_run(str(root)).framework()
    (warning,) = _warnings(caplog)
    assert victim.name in warning and "checksum" in warning.lower(), warning
    assert set(events["rank"].to_pylist()) == {0} and events.num_rows == 500
    assert events["end_us"].to_pylist() == [T0 + i * 10_000 + 9_000 for i in range(500)]


# (file, field) -> wrong values; every field of docs/format.md's run.json, nodes/<node>.json and window.json
WRONG_VALUES = [None, True, -1, 2**70, 1.5, float("nan"), "x", [], [1, "a"], {}, {"a": [1]}]


def _window(root: Path, node: str) -> Path:
    d = root / layout.trace_window_dir(node, 0, "detailed-0001763790000000")
    d.mkdir(parents=True)
    (d / "window.json").write_text(json.dumps({
        "layer": "detailed", "start_us": T0, "end_us": T0 + S, "mode": "TRAIN", "first_step": 1, "last_step": 2,
        "pid": 42, "status": "complete", "range": "1:2", "profiler": "torch.profiler", "activities": ["cpu"],
        "timer": None, "node": node, "rank": 0, "window": "detailed-0001763790000000", "files": [],
        "summary_error": None}))
    return d / "window.json"


# May be null (docs/format.md); every other field has the type of the value the writers give it.
OPTIONAL = {"end_us", "exit_code", "cpu_cores_physical", "gpu_driver", "gpu_absent_reason", "first_step", "last_step",
            "range", "timer", "summary_error"}


def _sane(field: str, value, good) -> bool:
    if value is None:
        return field in OPTIONAL
    if good is None:  # null in the writer's record: text or a time when set
        return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    if isinstance(good, (int, float)) and not isinstance(good, bool):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
        return ok and -(2**63) <= value < 2**63 and (value >= 0 or field == "exit_code")
    if isinstance(good, list):
        return isinstance(value, list) and all(isinstance(x, (str if field != "gpus" else dict)) for x in value)
    if isinstance(good, dict):
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return type(value) is type(good)


@pytest.mark.parametrize("which", ["run.json", "node", "window.json"])
def test_fields_of_the_wrong_type_are_left_out_and_info_renders(tmp_path, caplog, which):
    """`stallwatch info` raised on 41 wrong-typed values (a bool as the command, a bool for gpus, a 2**70
    start...); the store now leaves each such field out with one line, so nothing downstream meets it."""
    from stallwatch.log import forget
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present.info import render_info

    root = tmp_path / "run"
    make_run(root, nodes=("algo-1",), seconds=3)
    path = {"run.json": root / "run.json", "node": root / "nodes" / "algo-1.json",
            "window.json": _window(root, "algo-1")}[which]
    good = json.loads(path.read_text())
    good.setdefault("end_us", T0)
    for field in sorted(good):
        for wrong in WRONG_VALUES:
            path.write_text(json.dumps({**good, field: wrong}))
            run = open_run(str(root))
            info = run.info
            windows = run.profiles()
            record = {"run.json": info, "node": info["nodes"].get("algo-1", {}),
                      "window.json": (windows or [{}])[0]}[which]
            assert "algo-1" in render_info(RunAnalysis(run))
            if field in record:
                assert _sane(field, record[field], good[field]), (field, wrong, record[field])
            for key in (f"bad-fields-{root}/{path.relative_to(root)}", f"bad-window-{root}-{path.parent.relative_to(root)}"):
                forget(key)


def test_a_fifo_named_run_json_does_not_hang_the_reader(tmp_path, caplog):
    """open() of a FIFO waits for a writer forever: `stallwatch info` hung on one named run.json."""
    import os
    import subprocess
    import sys

    root = tmp_path / "run"
    make_run(root, nodes=("algo-1",), seconds=3)
    (root / "run.json").unlink()
    os.mkfifo(root / "run.json")
    os.mkfifo(root / "nodes" / "algo-2.json")
    p = subprocess.run([sys.executable, "-m", "stallwatch.cli", "info", str(root)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "algo-1" in p.stdout and "not a regular file" in p.stderr


def test_a_rank_beyond_int32_is_skipped_with_a_line(tmp_path, caplog):
    """A rank directory named 4294967296 overflowed the int32 rank column: summary, rules and report raised."""
    from stallwatch.analyze.judge.feed import iter_run
    from stallwatch.analyze.rules.registry import all_rules
    from stallwatch.analyze.judge.runner import evaluate
    from stallwatch.analyze.steps import step_stats
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present.info import render_info
    from tests.present.generated_run import training_run

    root = training_run(tmp_path / "run", n=300, gpus=0)
    shutil.copytree(root / "framework" / "algo-1" / "0", root / "framework" / "algo-1" / str(2**32))
    shutil.copytree(root / "framework" / "algo-1" / "0", root / "framework" / "algo-1" / "-3")
    run = open_run(str(root))
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        events = run.framework()
        assert set(events["rank"].to_pylist()) == {0}
        assert run.ranks() == {"algo-1": ["0"]}
        assert step_stats(events)
        results = evaluate(all_rules(), iter_run(run, all_rules()))
        assert {r.name for r in results} >= {"StepOutlier", "CPUBottleneck"}
        assert "algo-1" in render_info(RunAnalysis(run))
    said = [w for w in _warnings(caplog) if "4294967296" in w]
    assert len(said) == 1 and "0 … 2147483647" in said[0], _warnings(caplog)


def _rename_chunk(path: Path, start_us: int, end_us: int) -> Path:
    kind = path.name.split("-")[0]
    target = path.with_name(layout.chunk_name(kind, start_us, end_us))
    path.rename(target)
    return target


def test_a_file_named_in_1970_does_not_stretch_the_run(run_dir, caplog):
    """A segment named from 1970 made the batch rules step through 56 years an hour at a time (4 minutes)
    and put the timeline's origin in 1970: a name that cannot be true is checked against the data."""
    from stallwatch.analyze.judge.feed import iter_run
    from stallwatch.present.trace_export import run_origin_us

    root, nodes = run_dir
    victim = _chunks(root, "seg", "algo-1")[1]
    _rename_chunk(root / victim.path, 1, victim.end_us)
    run = open_run(str(root))
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        assert run.time_range()[0] == T0
        chunks = list(itertools.islice(iter_run(run), 10))
        assert run_origin_us(run) == T0
        assert _rows(run.system()) == all_rows(nodes)  # its rows are still read, once
        assert _rows(run.system(start_us=victim.start_us, end_us=victim.end_us + 1)) == \
            [r for r in all_rows(nodes) if victim.start_us <= r[0] <= victim.end_us]
    assert len(chunks) == len(nodes) + 1 and chunks[-1].final  # a slice per node (read node by node), then the end
    said = [w for w in _warnings(caplog) if "do not match its data" in w]
    assert len(said) == 1 and victim.path.rsplit("/", 1)[0] in said[0]


def test_data_from_1970_is_a_slice_of_its_own_not_56_years(tmp_path):
    """Snapshots really stamped 1970 next to this year's: the rules read the slices that hold data, not
    every hour between (the data exists; the gap does not)."""
    from stallwatch.analyze.judge.feed import iter_run

    root = tmp_path / "run"
    make_run(root, nodes=("algo-1",), seconds=5)
    old = NodeData("algo-1")
    w = writer_for(RunLocation(str(root)), "algo-1")
    feed(w, old, 0, 0, 3, t0=5 * S)
    w.close()
    run = open_run(str(root))
    chunks = list(itertools.islice(iter_run(run), 10))
    assert len(chunks) == 3 and chunks[-1].final  # 1970's slice, this year's, the end: not 56 years of hours
    assert sum(len(f) for c in chunks for f in c.system.values()) == 8


# -- fuzzing the readers: any JSON in the run's records, any damage to its files ---------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzz import JSON, fuzz, json_bytes  # noqa: E402

_FIELD_NAMES = ["format_version", "run_id", "created_us", "command", "versions", "config", "node", "hostname",
                "start_us", "end_us", "gpus", "ranks", "metrics", "exit_code", "status", "cpu_cores_logical",
                "sample_interval_ms", "samples_written", "layer", "first_step", "last_step", "files", "rank",
                "window", "pid", "summary_error"]
_RECORDS = st.dictionaries(st.sampled_from(_FIELD_NAMES), JSON, max_size=10)
_FILE = st.one_of(_RECORDS.map(json_bytes), JSON.map(json_bytes), st.binary(max_size=64))


@pytest.fixture(scope="module")
def fuzz_base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz") / "run"
    make_run(root, nodes=("algo-1",), seconds=3)
    _window(root, "algo-1")
    return root


@fuzz(60)
@given(run_json=_FILE, node_json=_FILE, window_json=_FILE)
def test_fuzz_json_records(fuzz_base, tmp_path_factory, run_json, node_json, window_json):
    """Whatever run.json, a node record and a window.json hold, info, profiles and `stallwatch info` answer;
    every field that comes out has a JSON type a renderer can take."""
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present.info import render_info

    root = tmp_path_factory.mktemp("case") / "run"
    shutil.copytree(fuzz_base, root)
    (root / "run.json").write_bytes(run_json)
    (root / "nodes" / "algo-1.json").write_bytes(node_json)
    (next(root.glob("traces/*/*/*")) / "window.json").write_bytes(window_json)
    run = open_run(str(root))
    info = run.info
    assert isinstance(info["nodes"], dict) and all(isinstance(n, dict) for n in info["nodes"].values())
    for record in [info, *info["nodes"].values(), *run.profiles()]:
        for key, value in record.items():
            if key != "nodes":
                json.dumps(value, allow_nan=False)  # plain, finite JSON: nothing a renderer could choke on
    assert "algo-1" in render_info(RunAnalysis(run))
    shutil.rmtree(root.parent)


def _damage(data: bytes, how: str, where: int, bits: int) -> bytes:
    if how == "truncate":
        return data[: where % max(1, len(data))]
    if how == "append":
        return data + bytes([bits]) * (where % 64 + 1)
    pos = len(data) - 1 - (where % min(len(data), 2048)) if how == "footer" else where % len(data)
    out = bytearray(data)
    out[pos] ^= bits or 1
    return bytes(out)


@pytest.fixture(scope="module")
def damage_base(tmp_path_factory) -> Path:
    from stallwatch.records import FrameworkEvent
    from stallwatch.store.framework_writer import FrameworkWriter

    root = tmp_path_factory.mktemp("damage") / "run"
    make_run(root, nodes=("algo-1",), seconds=30)
    w = FrameworkWriter(RunLocation(str(root)), "algo-1", 0, flush_interval_us=600 * S, max_bytes=1 << 30)
    for i in range(200):
        w.append(FrameworkEvent("step", "train_step", T0 + i * 100_000, T0 + i * 100_000 + 90_000, "TRAIN", i, 7))
    w.close()
    return root


@fuzz(80)
@given(which=st.sampled_from(["system-seg", "framework-seg"]), how=st.sampled_from(["flip", "footer", "truncate",
                                                                                    "append"]),
       where=st.integers(0, 1 << 20), bits=st.integers(0, 255))
def test_fuzz_damaged_files(damage_base, tmp_path_factory, which, how, where, bits):
    """A damaged Parquet file (a flipped bit anywhere, the footer included; cut short; garbage after it) costs
    at most its own rows: every reader answers, the other files read whole."""
    root = tmp_path_factory.mktemp("case") / "run"
    shutil.copytree(damage_base, root)
    victims = sorted(root.glob("system/algo-1/seg-*.parquet" if which == "system-seg"
                               else "framework/algo-1/0/seg-*.parquet"))
    victim = victims[0]
    victim.write_bytes(_damage(victim.read_bytes(), how, where, bits))
    run = open_run(str(root))
    system = run.system()
    run.system_wide("algo-1")
    run.system_overview()
    run.system_keys("algo-1")
    events = run.framework()
    run.time_range()
    run.time_slices(3_600_000_000)
    intact = open_run(str(damage_base))
    if which == "framework-seg":
        assert _rows(system) == _rows(intact.system())
        assert events.num_rows <= 200
    else:
        assert events.num_rows == 200
        lost = layout.parse_chunk(f"system/algo-1/{victim.name}")
        outside = [r for r in _rows(intact.system()) if not lost.start_us <= r[0] <= lost.end_us]
        assert [r for r in _rows(system) if not lost.start_us <= r[0] <= lost.end_us] == outside
    shutil.rmtree(root.parent)


def test_a_run_pinned_for_one_node_lists_only_that_nodes_folders(tmp_path):
    """A reader of one node of many (info's and the report's per-node statistics, the timeline) lists that node's
    folders alone, not every file of the run once per node; a node whose name begins another's ("algo-1",
    "algo-10") sees only its own files, and a name that is not one folder lists nothing."""
    from stallwatch.records import STEP, TRAIN
    from tests.analyze.rules._fw_gen import FwGen, write_events

    root = tmp_path / "run"
    make_run(root, nodes=("algo-1", "algo-10"), seconds=10)
    gen = FwGen()
    for node in ("algo-1", "algo-10"):
        for step in range(3):
            gen.events(node, 0, STEP, "step", TRAIN, step, T0 + step * S, T0 + step * S + S // 2)
    write_events(root, gen.table())
    run = open_run(str(root))
    listed: list[str] = []
    real = run.location.list

    def spy(rel_dir: str, recursive: bool = True):
        listed.append(rel_dir)
        return real(rel_dir, recursive)

    run.location.list = spy  # type: ignore[method-assign]
    one = run.pinned(node="algo-1")
    assert sorted(listed) == ["framework/algo-1", "system/algo-1"]
    assert {c.node for top in one._listing.values() for c in top} == {"algo-1"}
    events = one.framework(nodes=["algo-1"])
    assert events.num_rows == 3 and set(events["node"].to_pylist()) == {"algo-1"}
    assert one.framework(nodes=["algo-1"]).equals(run.framework(nodes=["algo-1"]))
    assert one.system_wide("algo-1").equals(run.system_wide("algo-1"))
    for odd in ("..", "a/b", ""):
        assert not any(run.pinned(node=odd)._listing.values())


def test_a_flipped_bit_in_a_framework_part_is_reported_skipped_and_counted_as_lost(tmp_path, caplog):
    """An Arrow part (written every flush, before its segment) with one bit of a pid flipped: its checksum fails,
    one warning names the file, the rank's other data reads, and the analysis's notes count the file as lost.
    Before, the pid read as another one (14047 → 145119 in the sweep), without a word."""
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.records import FrameworkEvent
    from stallwatch.store.framework_writer import FrameworkWriter

    root = tmp_path / "run"
    make_run(root, nodes=("algo-1",), seconds=5)
    location = RunLocation(str(root))
    for rank in (0, 1):
        w = FrameworkWriter(location, "algo-1", rank, flush_interval_us=600 * S, max_bytes=1 << 30)
        for i in range(100):
            w.append(FrameworkEvent("step", "train_step", T0 + i * 10_000, T0 + i * 10_000 + 9_000, "TRAIN", i, 14047))
        w.flush(T0 + S)  # a part, not yet compacted into its segment
    (victim,) = (root / "framework" / "algo-1" / "1").glob("part-*.arrow")
    data = bytearray(victim.read_bytes())
    at = data.index((14047).to_bytes(4, "little"))
    data[at + 2] ^= 0x01  # 14047 -> 79583: a value the plain Arrow reader returns without an error
    victim.write_bytes(bytes(data))
    import pyarrow as pa

    assert pa.ipc.open_file(str(victim)).read_all()["pid"].to_pylist()[0] == 79583  # silently another pid
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        run = open_run(str(root))
        events = run.framework()
        notes = RunAnalysis(run).notes
    (warning,) = [w for w in _warnings(caplog) if "unreadable" in w]
    assert victim.name in warning and "checksum" in warning, warning
    assert set(events["rank"].to_pylist()) == {0} and set(events["pid"].to_pylist()) == {14047}
    assert any("1 damaged file of the run could not be read" in n and victim.name in n for n in notes), notes
