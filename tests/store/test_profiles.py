"""Profiling windows in the store: traces/<node>/<rank>/<window>/ read back by Run.profiles(), operators()
and functions(), from local disk and, through the sampler's spool, from a real S3-protocol server."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pytest

from stallwatch.store import layout, profiles_codec
from stallwatch.store.location import RunLocation
from stallwatch.store.profiles_codec import functions_schema, operators_schema
from stallwatch.store.reader import open_run
from stallwatch.store.spool import SpoolingSink
from tests.profile_outputs import MATMULS, START_US, WORK_CALLS, artifact, make_real_outputs, stage
from tests.store.s3_server import S3Server

T0 = START_US


@pytest.fixture
def location(tmp_path) -> RunLocation:
    loc = RunLocation(str(tmp_path / "run"))
    loc.write_atomic(layout.RUN_JSON, b'{"run_id": "run"}')
    return loc


def _window(location: RunLocation, node: str, rank: int, layer: str, start_us: int, *,
            operators: list[dict] | None = None, functions: list[dict] | None = None,
            complete: bool = True) -> str:
    """A window as the sampler leaves it: summaries first, window.json last (left out: still being written)."""
    window = layout.window_name(layer, start_us)
    d = layout.trace_window_dir(node, rank, window)
    files = []
    if operators is not None:
        location.write_atomic(f"{d}/{layout.OPERATORS_PARQUET}", profiles_codec.encode_operators(operators))
        files.append(layout.OPERATORS_PARQUET)
    if functions is not None:
        location.write_atomic(f"{d}/{layout.FUNCTIONS_PARQUET}", profiles_codec.encode_functions(functions))
        files.append(layout.FUNCTIONS_PARQUET)
    if complete:
        record = {"layer": layer, "start_us": start_us, "end_us": start_us + 1000, "node": node, "rank": rank,
                  "window": window, "files": files, "summary_error": None}
        location.write_atomic(f"{d}/{layout.WINDOW_JSON}", json.dumps(record).encode())
    return window


def _op(name: str, calls: int, self_us: float, total_us: float, device: str = "cpu") -> dict:
    return {"operator": name, "device": device, "calls": calls, "self_us": self_us, "total_us": total_us}


def _fn(function: str, calls: int, self_us: float, total_us: float) -> dict:
    return {"function": function, "file": "train.py", "line": 10, "calls": calls, "self_us": self_us,
            "total_us": total_us}


def test_profiles_lists_complete_windows_by_node_rank_and_start(location):
    _window(location, "algo-2", 0, "detailed", T0, operators=[_op("aten::mm", 1, 1, 1)])
    _window(location, "algo-1", 10, "detailed", T0, operators=[])
    _window(location, "algo-1", 2, "python", T0 + 5, functions=[])
    _window(location, "algo-1", 2, "detailed", T0 + 9, operators=[])
    _window(location, "algo-1", 2, "detailed", T0 + 20, operators=[], complete=False)  # still being written
    run = open_run(location.uri)
    got = [(p["node"], p["rank"], p["start_us"], p["layer"]) for p in run.profiles()]
    assert got == [("algo-1", 2, T0 + 5, "python"), ("algo-1", 2, T0 + 9, "detailed"),
                   ("algo-1", 10, T0, "detailed"), ("algo-2", 0, T0, "detailed")]
    first = run.profiles()[0]
    assert first["path"] == f"traces/algo-1/2/python-{T0 + 5:016d}"
    assert first["files"] == ["functions.parquet"] and first["summary_error"] is None
    assert [p["layer"] for p in run.profiles("python")] == ["python"]
    assert len(run.profiles("detailed")) == 3


def test_operators_and_functions_carry_node_rank_and_window(location):
    w1 = _window(location, "algo-1", 0, "detailed", T0,
                 operators=[_op("aten::mm", 4, 40.0, 50.0), _op("gemm_kernel", 4, 30.0, 30.0, "cuda")])
    w2 = _window(location, "algo-2", 1, "detailed", T0 + 1, operators=[_op("aten::add", 2, 3.5, 3.5)])
    w3 = _window(location, "algo-1", 0, "python", T0 + 2, functions=[_fn("step", 3, 1.0, 9.0)])
    _window(location, "algo-1", 0, "detailed", T0 + 3, operators=[_op("aten::mm", 1, 1, 1)], complete=False)
    run = open_run(location.uri)

    ops = run.operators()
    assert ops.schema == operators_schema()
    assert ops.to_pylist() == [
        {"node": "algo-1", "rank": 0, "window": w1, **_op("aten::mm", 4, 40.0, 50.0)},
        {"node": "algo-1", "rank": 0, "window": w1, **_op("gemm_kernel", 4, 30.0, 30.0, "cuda")},
        {"node": "algo-2", "rank": 1, "window": w2, **_op("aten::add", 2, 3.5, 3.5)},
    ]
    assert run.operators(window=w2)["operator"].to_pylist() == ["aten::add"]
    assert run.operators(nodes="algo-1")["window"].to_pylist() == [w1, w1]
    assert run.operators(nodes=["algo-3"]).num_rows == 0

    fns = run.functions()
    assert fns.schema == functions_schema()
    assert fns.to_pylist() == [{"node": "algo-1", "rank": 0, "window": w3, **_fn("step", 3, 1.0, 9.0)}]


def test_no_windows_give_empty_tables_with_the_schema(location):
    run = open_run(location.uri)
    assert run.profiles() == []
    ops, fns = run.operators(), run.functions()
    assert ops.num_rows == 0 and ops.schema == operators_schema()
    assert fns.num_rows == 0 and fns.schema == functions_schema()
    assert [f.name for f in ops.schema][:3] == ["node", "rank", "window"]
    assert ops.schema.field("node").type == pa.dictionary(pa.int32(), pa.string())
    assert ops.schema.field("rank").type == pa.int32()


def test_an_unreadable_summary_is_skipped_with_one_warning(location, caplog):
    _window(location, "algo-1", 0, "detailed", T0, operators=[_op("aten::mm", 1, 1.0, 1.0)])
    bad = _window(location, "algo-1", 1, "detailed", T0, operators=[_op("aten::mm", 1, 1.0, 1.0)])
    bad_path = f"{layout.trace_window_dir('algo-1', 1, bad)}/{layout.OPERATORS_PARQUET}"
    location.write_atomic(bad_path, b"not parquet at all")
    location.write_atomic(f"{layout.trace_window_dir('algo-1', 2, bad)}/{layout.WINDOW_JSON}", b"{truncated")
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    run = open_run(location.uri)
    assert run.operators().num_rows == 1
    assert run.operators().num_rows == 1
    said = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len([s for s in said if bad_path in s]) == 1
    assert [p["rank"] for p in run.profiles()] == [0, 1]  # the broken window.json is skipped


def test_layout_names_and_window_names():
    assert layout.window_name("detailed", 1_763_800_000_000_000) == "detailed-1763800000000000"
    assert layout.trace_window_dir("algo-1", 3, "python-0000000000000001") == "traces/algo-1/3/python-0000000000000001"
    f = layout.parse_window_file("traces/algo-1/3/python-0000000000000001/window.json")
    assert f is not None and (f.node, f.rank, f.window, f.name) == ("algo-1", "3", "python-0000000000000001",
                                                                    "window.json")
    assert f.directory == "traces/algo-1/3/python-0000000000000001"
    assert layout.parse_window_file("traces/algo-1/3/window.json") is None
    assert layout.parse_window_file("system/algo-1/3/w/window.json") is None
    for good in ("detailed-0000000000000001", "a", "x_y.z-1"):
        assert layout.valid_window_name(good)
    for bad in ("", ".", "..", ".hidden", "a/b", "a b", "dé", "x" * 129, None):
        assert not layout.valid_window_name(bad)  # type: ignore[arg-type]


def test_a_window_stored_through_the_spool_reads_back_from_s3(s3_server: S3Server, s3_env, bucket, tmp_path):
    """The sampler of an S3 run: ArtifactStore -> SpoolingSink -> the S3 server; read with open_run(s3://)."""
    from stallwatch.collect.artifacts import ArtifactStore

    real = make_real_outputs(tmp_path / "real")
    uri = f"s3://{bucket}/runs/run-1"
    remote = RunLocation(uri)
    remote.write_atomic(layout.RUN_JSON, b'{"run_id": "run-1"}')
    sink = SpoolingSink(remote, tmp_path / "spool")
    staging = tmp_path / "staging"
    staging.mkdir()
    store = ArtifactStore(sink, "algo-1", str(staging))
    store.submit(0, artifact("detailed", {"trace.json": stage(real.trace, staging)}))
    store.submit(1, artifact("python", {"profile.pstats": stage(real.pstats, staging)}))
    store.close(60)
    assert sink.close(60)
    assert list(staging.iterdir()) == []

    keys = s3_server.keys(bucket, "runs/run-1/traces/")
    detailed = f"runs/run-1/traces/algo-1/0/detailed-{START_US:016d}"
    assert f"{detailed}/trace.json.gz" in keys and f"{detailed}/window.json" in keys
    run = open_run(uri)
    assert [(p["rank"], p["layer"]) for p in run.profiles()] == [(0, "detailed"), (1, "python")]
    ops = run.operators()
    mm = [r for r in ops.to_pylist() if r["operator"] == "aten::mm"]
    assert len(mm) == 1 and mm[0]["calls"] == MATMULS and mm[0]["node"] == "algo-1"
    work = [r for r in run.functions().to_pylist() if r["function"] == "busy_work"]
    assert len(work) == 1 and work[0]["calls"] == WORK_CALLS and work[0]["rank"] == 1
