"""The batch read path's shortcuts give what the plain ways give: one FrameworkColumns shared per chunk,
groups() by counting equal to groups() by sorting, and read_run reading only the metrics the rules declare."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from stallwatch.analyze.rules import Chunk, Rule
from stallwatch.analyze.rules.feed import node_frame, read_run, rule_metrics
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.analyze.rules.runner import evaluate
from stallwatch.analyze.rules.steps import FrameworkColumns, framework_columns
from stallwatch.records import CPU_UTIL, GPU_UTIL, TIMESTAMP, WORKERS_ALIVE, framework_schema
from stallwatch.store.reader import open_run

from ...run_builder import make_run
from ._fw_gen import FwGen, whole


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
