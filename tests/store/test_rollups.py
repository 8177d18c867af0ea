"""Rollups: written by the real writers as segments are compacted, equal to the same statistics taken over every
stored sample; rebuilt (and cached) for runs without them; a damaged or wrong-typed file skipped with one log line."""

from __future__ import annotations

import io
import json
import logging
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallwatch.records import FrameworkEvent
from stallwatch.store import layout
from stallwatch.store.chunk_writer import StorageBudget
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run
from stallwatch.store.rollup_codec import SYSTEM_LEVELS_US, combine_system, stat_column, system_rows
from stallwatch.store.rollup_writer import SYSTEM_BLOCK_US, LeftoverRollups
from stallwatch.store.rollups import RunRollups
from tests.run_builder import KEYS, T0, S, make_run, run_record

SPIKE_AT = 137  # snapshot index of a one-sample spike planted on cpu0


@pytest.fixture(autouse=True)
def _stallwatch_log_reaches_caplog(monkeypatch):
    monkeypatch.setattr(logging.getLogger("stallwatch"), "propagate", True)


def _expected(run_dir, node: str, level: int) -> pa.Table:
    """The rollup computed in one go over every stored snapshot of the node (the reference)."""
    wide = open_run(str(run_dir)).system_wide(node)
    names = [c for c in wide.column_names if c != "timestamp_us"]
    values = np.column_stack([wide[c].to_numpy(zero_copy_only=False) for c in names])
    rows = system_rows(wide["timestamp_us"].to_numpy(), values, names, levels=(level,))
    return rows


def _assert_same(got: pa.Table, want: pa.Table) -> None:
    assert got["bucket_us"].to_pylist() == want["bucket_us"].to_pylist()
    for key in ("count", "first_us", "last_us", "gap_us"):
        assert got[key].to_pylist() == want[key].to_pylist(), key
    for k in KEYS:
        for stat in ("min", "max", "n"):
            col = stat_column(stat, k.column)
            np.testing.assert_array_equal(got[col].to_numpy(zero_copy_only=False),
                                          want[col].to_numpy(zero_copy_only=False), err_msg=col)
        col = stat_column("mean", k.column)
        np.testing.assert_allclose(got[col].to_numpy(zero_copy_only=False), want[col].to_numpy(zero_copy_only=False),
                                   rtol=1e-6, err_msg=col)


def _spiked_run(root, seconds: int = 400, t0: int | None = None):
    """A finished one-node run by the real SystemWriter (10 s segments, so buckets straddle segments)."""
    from tests import run_builder

    original = run_builder.planted_value

    def planted(node_index: int, i: int, j: int) -> float:
        if KEYS[j].column == "cpu0/cpu_util" and i == SPIKE_AT:
            return 1000.0
        return original(node_index, i, j)

    run_builder.planted_value = planted
    try:
        return make_run(root, nodes=("algo-1",), seconds=seconds, **({} if t0 is None else {"t0": t0}))
    finally:
        run_builder.planted_value = original


def test_the_writer_leaves_rollups_equal_to_every_sample_at_each_level(tmp_path):
    run_dir = tmp_path / "run"
    _spiked_run(run_dir)
    files = RunLocation(str(run_dir)).list(layout.system_rollup_dir("algo-1"))
    assert len(files) == 1  # one block file, rewritten as segments were compacted
    rollups = RunRollups(open_run(str(run_dir)))
    for level in SYSTEM_LEVELS_US:
        got = rollups.system("algo-1", level)
        assert got.rebuilt == 0
        _assert_same(got.rows, _expected(run_dir, "algo-1", level))
        # the one-sample spike is the max of its bucket at every level: peaks are never decimated away
        assert float(np.nanmax(got.rows[stat_column("max", "cpu0/cpu_util")].to_numpy())) == 1000.0


def test_blocks_split_at_their_boundary_and_together_cover_every_segment(tmp_path):
    run_dir = tmp_path / "run"
    boundary = (1_763_790_000_000_000 // SYSTEM_BLOCK_US + 1) * SYSTEM_BLOCK_US
    _spiked_run(run_dir, seconds=300, t0=boundary - 155 * S)
    names = sorted(e.path for e in RunLocation(str(run_dir)).list(layout.system_rollup_dir("algo-1")))
    spans = [layout.parse_rollup_name(n.rsplit("/", 1)[-1]) for n in names]
    assert len(spans) == 2 and spans[0][1] == boundary - 1 and spans[1][0] == boundary
    got = RunRollups(open_run(str(run_dir))).system("algo-1", SYSTEM_LEVELS_US[0])
    assert got.rebuilt == 0
    _assert_same(got.rows, _expected(run_dir, "algo-1", SYSTEM_LEVELS_US[0]))


def test_a_run_without_rollups_gets_them_rebuilt_and_cached(tmp_path):
    run_dir = tmp_path / "run"
    _spiked_run(run_dir)
    shutil.rmtree(run_dir / layout.ROLLUPS_DIR)
    first = RunRollups(open_run(str(run_dir))).system("algo-1", SYSTEM_LEVELS_US[1])
    assert first.rebuilt > 0
    _assert_same(first.rows, _expected(run_dir, "algo-1", SYSTEM_LEVELS_US[1]))
    assert RunLocation(str(run_dir)).list(layout.system_rollup_dir("algo-1"))  # cached into the run
    again = RunRollups(open_run(str(run_dir))).system("algo-1", SYSTEM_LEVELS_US[1])
    assert again.rebuilt == 0
    _assert_same(again.rows, first.rows)


def test_a_run_that_cannot_be_written_keeps_rebuilt_rollups_in_memory(tmp_path, caplog):
    run_dir = tmp_path / "run"
    _spiked_run(run_dir)
    shutil.rmtree(run_dir / layout.ROLLUPS_DIR)
    (run_dir / layout.ROLLUPS_DIR).write_text("a file where the rollups' folder would be")  # every write fails
    rollups = RunRollups(open_run(str(run_dir)))
    with caplog.at_level(logging.INFO, logger="stallwatch"):
        for level in SYSTEM_LEVELS_US:
            _assert_same(rollups.system("algo-1", level).rows, _expected(run_dir, "algo-1", level))
    said = [r for r in caplog.records if "kept in memory" in r.getMessage()]
    assert len(said) == 1


def _wrong_typed() -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"level_us": pa.array(["10s"]), "bucket_us": pa.array(["x"])}), sink)
    return sink.getvalue()


@pytest.mark.parametrize("damage", [b"PAR1 not a parquet file", _wrong_typed()], ids=["garbage", "wrong-types"])
def test_a_damaged_rollup_is_skipped_with_one_line_and_rebuilt(tmp_path, caplog, damage):
    run_dir = tmp_path / "run"
    _spiked_run(run_dir)
    (path,) = [e.path for e in RunLocation(str(run_dir)).list(layout.system_rollup_dir("algo-1"))]
    (run_dir / path).write_bytes(damage)
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        got = RunRollups(open_run(str(run_dir))).system("algo-1", SYSTEM_LEVELS_US[0])
    assert got.rebuilt > 0
    _assert_same(got.rows, _expected(run_dir, "algo-1", SYSTEM_LEVELS_US[0]))
    skipped = [r for r in caplog.records if "skipping rollup" in r.getMessage()]
    assert len(skipped) == 1 and path in skipped[0].getMessage()


def test_a_copied_or_foreign_rollup_file_is_skipped_not_counted_twice(tmp_path, caplog):
    """A copy of a rollup under a wider span, and a file of another run named into this one's span: the figures
    stay those of the data (they doubled: 235 -> 470 snapshots on the dashboard), each skip said once."""
    run_dir = tmp_path / "run"
    _spiked_run(run_dir)
    directory = layout.system_rollup_dir("algo-1")
    paths = sorted(e.path for e in RunLocation(str(run_dir)).list(directory))
    start, end = layout.parse_rollup_name(paths[0].rsplit("/", 1)[-1])
    last = max(layout.parse_rollup_name(p.rsplit("/", 1)[-1])[1] for p in paths)
    shutil.copy(run_dir / paths[0], run_dir / directory / layout.rollup_name(start - 1, end + 1))
    other = tmp_path / "other"
    _spiked_run(other, t0=T0 + 10 ** 9)
    foreign = min(e.path for e in RunLocation(str(other)).list(directory))
    shutil.copy(other / foreign, run_dir / directory / layout.rollup_name(last + 2, last + 3))
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        got = RunRollups(open_run(str(run_dir))).system("algo-1", SYSTEM_LEVELS_US[0])
    _assert_same(got.rows, _expected(run_dir, "algo-1", SYSTEM_LEVELS_US[0]))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "lies inside" in said and "not this stream's" in said


def test_buckets_split_across_files_merge_into_the_whole(tmp_path):
    ts = np.arange(0, 120) * S + 1_763_790_000_000_000 + 3 * S
    values = np.arange(120, dtype=float).reshape(-1, 1)
    values[50] = np.nan
    whole = system_rows(ts, values, ["cpu/cpu_util"])
    halves = combine_system([system_rows(ts[:47], values[:47], ["cpu/cpu_util"]),
                             system_rows(ts[47:], values[47:], ["cpu/cpu_util"])])
    for c in whole.column_names:
        np.testing.assert_allclose(halves[c].to_numpy(zero_copy_only=False).astype(float),
                                   whole[c].to_numpy(zero_copy_only=False).astype(float), rtol=1e-6, err_msg=c)


def test_framework_rollups_count_and_time_every_event(tmp_path):
    location = RunLocation(str(tmp_path / "run"))
    t0 = 1_763_790_000_000_000
    w = FrameworkWriter(location, "algo-1", 0, flush_interval_us=2 * S, max_bytes=1 << 30, segment_us=50 * S)
    w.append(FrameworkEvent(pid=1, kind="loop", name="loader", mode="TRAIN", step=None, start_us=t0, end_us=t0,
                            args='{"how": "loader"}'))
    durations = []
    for i in range(300):
        start = t0 + i * 500_000
        dur = 400_000 + (i % 7) * 1000 + (200_000 if i == 123 else 0)
        durations.append(dur)
        w.append(FrameworkEvent(pid=1, kind="data_wait", name="next", mode="TRAIN", step=i, start_us=start,
                                end_us=start + 20_000, args=None))
        w.append(FrameworkEvent(pid=1, kind="step", name="step", mode="TRAIN", step=i, start_us=start,
                                end_us=start + dur, args=None))
        w.tick(start)
    w.close()
    location.write_atomic(layout.RUN_JSON, json.dumps(run_record("run", "algo-1", t0)).encode())
    assert location.list(layout.framework_rollup_dir("algo-1", 0))  # written as the segments were compacted
    fw = RunRollups(open_run(str(tmp_path / "run"))).framework()
    steps = fw.filter(pa.compute.equal(fw["kind"], "step"))
    assert sum(steps["count"].to_pylist()) == 300
    assert sum(steps["sum_us"].to_pylist()) == sum(durations)
    assert max(steps["max_us"].to_pylist()) == max(durations)  # the slow step survives
    assert max(steps["max_step"].to_pylist()) == 299
    waits = fw.filter(pa.compute.equal(fw["kind"], "data_wait"))
    assert sum(waits["sum_us"].to_pylist()) == 300 * 20_000 and all(waits["in_step"].to_pylist())
    loop = fw.filter(pa.compute.equal(fw["kind"], "loop")).to_pylist()
    assert [(x["name"], x["args"], x["node"], x["rank"]) for x in loop] == [("loader", '{"how": "loader"}', "algo-1", 0)]


def _bytes_under(root, top: str) -> int:
    return sum(p.stat().st_size for p in (root / top).rglob("*") if p.is_file()) if (root / top).exists() else 0


def _write_node(root, max_bytes: int, seconds: int = 300, first: int = 0, budget: StorageBudget | None = None,
                stored: int = 0):
    """One node written by the real SystemWriter (10 s segments, a rollup rewrite per segment) under a cap."""
    from stallwatch.store.system_writer import SystemWriter
    from tests import run_builder

    location = RunLocation(str(root))
    w = SystemWriter(location, "algo-1", KEYS, interval_us=S, flush_interval_us=2 * S, max_bytes=max_bytes,
                     segment_us=10 * S, stored_bytes=stored, budget=budget)
    run_builder.feed(w, run_builder.NodeData("algo-1"), 0, first, seconds)
    w.close()
    return w


def test_a_resumed_nodes_earlier_rollups_count_in_the_cap_and_give_their_room_to_data(tmp_path):
    """A sampler that resumes a node (after a restart) found the earlier sampler's rollups on disk and counted
    only the data: together they could pass the cap. Now they count, and are deleted when data needs the room."""
    root = tmp_path / "run"
    _write_node(root, 1 << 30)  # the earlier sampler: 300 s of data and its rollups
    data, rollups = _bytes_under(root, layout.SYSTEM_DIR), _bytes_under(root, layout.ROLLUPS_DIR)
    leftover = LeftoverRollups.of_node(RunLocation(str(root)), "algo-1")
    assert leftover.bytes == rollups > 0
    limit = 2 * data + rollups // 2  # room for twice the data, not for the rollups beside it
    budget = StorageBudget(limit, data + leftover.bytes)
    leftover.count_in(budget)
    resumed = _write_node(root, limit, first=300, budget=budget, stored=data)  # the same 300 s more
    on_disk = sum(_bytes_under(root, top) for top in (layout.SYSTEM_DIR, layout.ROLLUPS_DIR))
    assert resumed.samples_dropped == 0 and on_disk <= limit and budget.used == on_disk
    assert leftover.bytes == 0  # given back to data, with this sampler's own
    assert not (root / layout.ROLLUPS_DIR).exists() or _bytes_under(root, layout.ROLLUPS_DIR) == 0


def test_rollups_count_in_the_storage_cap_and_give_their_room_to_data(tmp_path, caplog):
    """The cap bounds the data and the rollups together: with room for both, the budget counts exactly what is on
    disk; with room for the data and only part of the rollups, every snapshot is kept, the rollups are given up
    (one line), nothing on disk passes the cap, and readers rebuild the rollups from the data."""
    roomy = _write_node(tmp_path / "roomy", 1 << 30)
    data = _bytes_under(tmp_path / "roomy", layout.SYSTEM_DIR)
    rollups = _bytes_under(tmp_path / "roomy", layout.ROLLUPS_DIR)
    assert rollups > 0 and roomy._budget.used == data + rollups
    limit = data + rollups // 2
    caplog.set_level(logging.INFO, logger="stallwatch")
    tight = _write_node(tmp_path / "tight", limit)
    on_disk = sum(_bytes_under(tmp_path / "tight", top) for top in (layout.SYSTEM_DIR, layout.ROLLUPS_DIR))
    assert tight.samples_dropped == 0 and on_disk <= limit and tight._budget.used == on_disk
    assert _bytes_under(tmp_path / "tight", layout.ROLLUPS_DIR) == 0
    assert "rollups" in caplog.text and "rebuild" in caplog.text
    location = RunLocation(str(tmp_path / "tight"))
    location.write_atomic(layout.RUN_JSON, json.dumps(run_record("tight", "algo-1", T0)).encode())
    got = RunRollups(open_run(str(tmp_path / "tight"))).system("algo-1", SYSTEM_LEVELS_US[0])
    assert got.rebuilt > 0 and got.rows["count"].to_pylist() and sum(got.rows["count"].to_pylist()) == 300


def test_untimed_steps_are_summed_per_minute_in_the_rollups_and_read_back_as_in_the_run(tmp_path):
    """Sampled steps write an `untimed` marker a second; the rollups keep one row per minute and mode whose args add
    theirs up (a marker a second kept verbatim would be 86,400 rows a rank-day). Args that are not plain counts (the
    job wrote them: untrusted) read as 0."""
    from stallwatch.analyze import rollup_views, sampled

    location = RunLocation(str(tmp_path / "run"))
    t0 = 1_763_790_000_000_000
    w = FrameworkWriter(location, "algo-1", 0, flush_interval_us=2 * S, max_bytes=1 << 30, segment_us=50 * S)
    for i in range(150):  # 150 s of stretches: 3 minutes, segments of 50 s
        start = t0 + i * S
        w.append(FrameworkEvent(pid=1, kind="untimed", name="steps", mode="TRAIN", step=None, start_us=start + 20_000,
                                end_us=start + S, args=f'{{"steps": 900, "first": {i * 1000}, "stretches": 1, '
                                                     f'"us": 980000}}'))
        w.append(FrameworkEvent(pid=1, kind="step", name="train_step", mode="TRAIN", step=i * 1000 + 900,
                                start_us=start + S - 10, end_us=start + S, args=None))
        w.tick(start)
    w.append(FrameworkEvent(pid=1, kind="untimed", name="steps", mode="EVAL", step=None, start_us=t0 + 150 * S,
                            end_us=t0 + 151 * S, args='{"steps": "lots", "us": -1}'))
    w.close()
    location.write_atomic(layout.RUN_JSON, json.dumps(run_record("run", "algo-1", t0)).encode())
    fw = RunRollups(open_run(str(tmp_path / "run"))).framework()
    rows = fw.filter(pa.compute.equal(fw["kind"], "untimed"))
    assert rows.num_rows <= 10  # per minute and file (a minute split between files: a row in each), not per marker
    raw = sampled.untimed(open_run(str(tmp_path / "run")).framework(kinds=["untimed"]))
    rolled = sampled.untimed(rollup_views.markers(fw).filter(pa.compute.equal(rollup_views.markers(fw)["kind"],
                                                                                "untimed")))
    assert [(u.mode, u.steps, u.untimed_us) for u in raw] == [("TRAIN", 135_000, 150 * 980_000)]
    assert [(u.mode, u.steps, u.stretches, u.untimed_us) for u in rolled] == [("TRAIN", 135_000, 150, 150 * 980_000)]


@pytest.mark.parametrize("late", ["first step's record", "long event"])
def test_segments_whose_events_come_out_of_order_are_covered_by_the_rollups_once(tmp_path, late):
    """Events are written in the order they end: a long first step's record reaches the stream after its phases'
    segment was written, and starts before it; a long event ends after everything the next segment holds. The
    block's rollup file must still cover every segment, or readers rebuild those segments and count them twice."""
    location = RunLocation(str(tmp_path / "run"))
    t0 = 1_763_790_000_000_000
    w = FrameworkWriter(location, "algo-1", 0, flush_interval_us=2 * S, max_bytes=1 << 30, segment_us=50 * S)
    events = [FrameworkEvent(pid=1, kind="forward", name="model", mode="TRAIN", step=0, start_us=t0 + 5 * S,
                             end_us=t0 + 6 * S, args=None)]
    w.append(events[0])
    w.tick(t0 + 6 * S)
    for i in range(1, 200):
        start = t0 + 60 * S + i * 500_000
        if i == 3 and late == "first step's record":  # step 0 began before its forward, lasted a minute
            events.append(FrameworkEvent(pid=1, kind="step", name="step", mode="TRAIN", step=0, start_us=t0,
                                         end_us=t0 + 60 * S, args=None))
            w.append(events[-1])
        if i == 10 and late == "long event":  # ends past every later event of the run
            events.append(FrameworkEvent(pid=1, kind="checkpoint", name="save", mode="TRAIN", step=None,
                                         start_us=start, end_us=start + 400 * S, args=None))
            w.append(events[-1])
        events.append(FrameworkEvent(pid=1, kind="step", name="step", mode="TRAIN", step=i, start_us=start,
                                     end_us=start + 400_000, args=None))
        w.append(events[-1])
        w.tick(start)
    w.close()
    location.write_atomic(layout.RUN_JSON, json.dumps(run_record("run", "algo-1", t0)).encode())
    assert len(location.list(layout.framework_dir("algo-1", 0))) >= 3  # several segments, one out of order
    fw = RunRollups(open_run(str(tmp_path / "run"))).framework()
    assert sum(fw["count"].to_pylist()) == len(events)
    steps = fw.filter(pa.compute.equal(fw["kind"], "step"))
    assert sum(steps["sum_us"].to_pylist()) == sum(e.end_us - e.start_us for e in events if e.kind == "step")
