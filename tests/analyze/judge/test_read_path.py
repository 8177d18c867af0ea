"""The batch read path's shortcuts give what the plain ways give: one FrameworkColumns shared per chunk,
groups() by counting equal to groups() by sorting, and read_run reading only the metrics the rules declare."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from stallwatch.analyze.rules import Chunk, Rule
from stallwatch.analyze.judge.feed import node_frame, read_run, rule_metrics
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.analyze.framework_frame import framework_columns, FrameworkColumns
from stallwatch.records import CPU_UTIL, GPU_UTIL, TIMESTAMP, WORKERS_ALIVE, framework_schema
from stallwatch.store.reader import open_run

from ...run_builder import make_run
from ..rules._fw_gen import FwGen, whole, write_events


def _events(seed: int = 0) -> pa.Table:
    gen = FwGen()
    for node in ("algo-1", "algo-2"):
        for rank in (0, 3, 7):
            for mode in ("TRAIN", "EVAL"):
                gen.steps(node=node, rank=rank, mode=mode, n=30, seed=seed + rank)
    return gen.table()


def test_framework_columns_are_built_once_per_events_table():
    chunk = whole(_events())
    first = framework_columns(chunk)
    assert framework_columns(chunk) is first
    chunk.framework = _events(1)  # a new table: new columns
    assert framework_columns(chunk) is not first and framework_columns(chunk).table is chunk.framework


def test_groups_by_counting_equal_groups_by_sorting():
    cols = FrameworkColumns(_events())
    rng = np.random.default_rng(0)
    for mask in (np.ones(cols.n, bool), rng.random(cols.n) < 0.3, cols.kind_is("step"), np.zeros(cols.n, bool)):
        for by_mode in (True, False):
            fast = cols.groups(mask, by_mode=by_mode)
            idx = np.flatnonzero(mask)
            slow = cols._groups_sorted(idx, by_mode) if idx.size else []
            assert [k for k, _ in fast] == [k for k, _ in slow]
            assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(fast, slow))


def test_kind_is_and_mode_is_match_the_names():
    cols = FrameworkColumns(_events())
    kinds = np.array(cols.kinds, object)[cols.kind]
    modes = np.array(cols.modes, object)[cols.mode]
    assert np.array_equal(cols.kind_is("step", "forward"), np.isin(kinds, ["step", "forward"]))
    assert np.array_equal(cols.mode_is(["EVAL"]), modes == "EVAL")
    assert not cols.kind_is("nope").any()
    empty = FrameworkColumns(framework_schema().empty_table())
    assert empty.groups(np.zeros(0, bool)) == [] and empty.kind_is("step").size == 0


class _Any(Rule):
    name = "AnyMetric"


class _Cpu(Rule):
    name = "CpuOnly"
    metrics = (CPU_UTIL,)


def test_rule_metrics_is_the_union_or_all():
    assert rule_metrics([_Cpu]) == {CPU_UTIL}
    assert rule_metrics([_Cpu, _Any]) is None
    union = rule_metrics(builtin_rules())
    assert {CPU_UTIL, GPU_UTIL, WORKERS_ALIVE} <= union
    assert rule_metrics() is None  # _Any (defined in this process) may read anything


def test_read_run_with_the_builtin_rules_metrics_gives_the_same_results(tmp_path):
    make_run(tmp_path / "run")
    run = open_run(str(tmp_path / "run"))
    full, lean = read_run(run, [_Any]), read_run(run, builtin_rules())
    assert all(set(lean.system[n].columns) <= set(full.system[n].columns) for n in full.system)
    a = [r.to_json() for r in evaluate(builtin_rules(), [full])]
    b = [r.to_json() for r in evaluate(builtin_rules(), [lean])]
    assert a == b


def test_node_frame_sorts_only_when_needed():
    ts = np.array([3, 1, 2], np.int64)
    table = pa.table({TIMESTAMP: ts, "cpu/cpu_util": pa.array([30.0, 10.0, 20.0], pa.float32())})
    frame = node_frame("n", table)
    assert frame.timestamps.tolist() == [1, 2, 3] and frame.columns["cpu/cpu_util"].tolist() == [10, 20, 30]
    frame = node_frame("n", table.take([1, 2, 0]))
    assert frame.timestamps.tolist() == [1, 2, 3] and frame.columns["cpu/cpu_util"].tolist() == [10, 20, 30]


def test_a_chunk_stays_a_plain_dataclass():
    chunk = whole(_events())
    framework_columns(chunk)
    assert chunk == Chunk(chunk.system, chunk.framework, chunk.run, final=True)


def test_batch_reads_the_run_slice_by_slice_with_the_same_results(tmp_path):
    """Pattern: two nodes, 120 s of snapshots, steps on two ranks per node with slow steps planted; read in
    7-second slices (events straddling a slice edge, files spanning several slices) vs as one chunk."""
    from stallwatch.analyze.judge.feed import iter_run

    from ...run_builder import T0

    make_run(tmp_path / "run", seconds=120)
    gen = FwGen()
    for node in ("algo-1", "algo-2"):
        for rank in (0, 1):
            gen.dataloader(node=node, rank=rank, at_us=T0 + 1_000_000)
            gen.steps(node=node, rank=rank, n=900, start_us=T0 + 2_000_000, seed=rank,
                      slow={37 * k + 5: 900_000 for k in range(12)})
    write_events(tmp_path / "run", gen.table())
    run = open_run(str(tmp_path / "run"))
    chunks = list(iter_run(run, builtin_rules(), slice_us=7_000_000))
    assert len(chunks) > 15 and [c.final for c in chunks].count(True) == 1 and chunks[-1].final
    assert sum(c.framework.num_rows for c in chunks) == run.framework().num_rows
    assert sum(len(c.system["algo-1"]) for c in chunks) == 120
    one = [r.to_json() for r in evaluate(builtin_rules(), [read_run(run, builtin_rules())])]
    sliced = [r.to_json() for r in evaluate(builtin_rules(), iter_run(run, builtin_rules(), slice_us=7_000_000))]
    assert one == sliced
    fired = {r["RuleName"]: r["RuleTriggered"] for r in sliced}
    assert fired["StepOutlier"] == 4  # every (node, rank): 12 planted outliers > n_outliers=10


def test_a_run_without_data_reads_as_one_empty_final_chunk(tmp_path):
    from stallwatch.analyze.judge.feed import iter_run
    from stallwatch.store import layout
    from stallwatch.store.location import RunLocation

    RunLocation(str(tmp_path / "run")).write_atomic(layout.RUN_JSON, b'{"format_version": 1, "run_id": "r"}')
    chunks = list(iter_run(open_run(str(tmp_path / "run"))))
    assert len(chunks) == 1 and chunks[0].final and chunks[0].framework.num_rows == 0


def test_a_batch_read_of_a_running_run_sees_parts_compacted_under_it(tmp_path):
    """Pattern: a running node has written 40 snapshots as parts; the batch read lists them, reads its first
    slice, then the sampler compacts every part into a segment (and deletes the parts): the read lists again
    and every snapshot stored when it began is still evaluated, once."""
    from stallwatch.analyze.judge.feed import iter_run
    from stallwatch.store import layout
    from stallwatch.store.location import RunLocation

    from ...run_builder import T0, NodeData, S, feed, node_record, run_record, write_node_json, writer_for

    location = RunLocation(str(tmp_path / "run"))
    location.write_atomic(layout.RUN_JSON, json.dumps(run_record("run", "n1", T0)).encode())
    write_node_json(location, node_record("n1", T0, None, samples=40))
    writer = writer_for(location, "n1", flush_s=2, segment_s=10_000)  # parts only, until close()
    feed(writer, NodeData("n1"), 0, 0, 40)
    assert not [e for e in location.list("system") if "seg-" in e.path]
    stored = open_run(str(tmp_path / "run")).system_wide("n1").num_rows  # the last snapshot is still in memory
    assert stored >= 35
    chunks = iter_run(open_run(str(tmp_path / "run")), slice_us=10 * S, read_ahead=0)
    seen = len(next(chunks).system["n1"])
    writer.close()  # compaction: one segment, the parts deleted
    assert not [e for e in location.list("system") if "part-" in e.path]
    seen += sum(len(c.system["n1"]) for c in chunks)
    assert seen == stored  # what was stored when the read began, each snapshot once


def test_slices_shorten_as_the_run_holds_more_per_hour():
    """About SLICE_BYTES of one node's stored data a slice, in whole minutes from 1 min to 1 h: a slice's memory
    does not grow with the number of nodes."""
    from stallwatch.analyze.judge.feed import MIN_SLICE_US, SLICE_BYTES, SLICE_US, slice_length

    class Stored:
        def __init__(self, per_hour: float, nodes: int = 1) -> None:
            self.per_hour, self.nodes = per_hour, [f"n{k}" for k in range(nodes)]

        def bytes_per_hour(self) -> float:
            return self.per_hour

    assert slice_length(Stored(0)) == SLICE_US  # an empty run
    assert slice_length(Stored(SLICE_BYTES / 2)) == SLICE_US  # a small run: an hour
    assert slice_length(Stored(SLICE_BYTES * 8)) == SLICE_US // 8 // MIN_SLICE_US * MIN_SLICE_US  # 7 min
    assert slice_length(Stored(SLICE_BYTES * 16)) < slice_length(Stored(SLICE_BYTES * 8))
    assert slice_length(Stored(SLICE_BYTES * 1000)) == MIN_SLICE_US  # a big job: a minute at a time
    assert all(slice_length(Stored(SLICE_BYTES * k)) % MIN_SLICE_US == 0 for k in (3, 7, 13, 29))
    assert slice_length(Stored(SLICE_BYTES * 8 * 64, nodes=64)) == slice_length(Stored(SLICE_BYTES * 8))  # per node
