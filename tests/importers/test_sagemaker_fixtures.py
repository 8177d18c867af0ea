"""The public sagemaker-debugger profiler test resources (real SageMaker output, tests/importers/data/) imported:
the counts SageMaker's own reader tests assert on them, reproduced from the stallwatch run."""

from __future__ import annotations

import gzip
import json
import pstats
import shutil
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest

from stallwatch.importers.sagemaker.importer import import_sagemaker
from stallwatch.store.reader import open_run

DATA = Path(__file__).parent / "data" / "sagemaker-debugger"
S = 1_000_000


def _import(tmp_path: Path, source: Path):
    summary = import_sagemaker(str(source), str(tmp_path / "run"))
    return summary, open_run(str(tmp_path / "run"))


def _values(run, start_s: float | None = None, end_s: float | None = None, prefix: str = "") -> int:
    """Imported system values (derived node totals left out) with a timestamp in [start_s, end_s], as
    SageMaker's reader counts its events (bounds included)."""
    t = run.system(start_us=None if start_s is None else int(start_s * S),
                   end_us=None if end_s is None else int(end_s * S) + 1)
    devices = t["device"].cast("string").to_pylist()
    return sum(1 for d in devices if d[-1:].isdigit() and d.startswith(prefix))


def _events_in(run, start_us: int, end_us: int) -> int:
    """Events active in [start_us, end_us], bounds included (SageMaker's get_events_within_time_range)."""
    return run.framework(start_us=start_us - 1, end_us=end_us + 1).num_rows


def test_system_and_python_timelines(tmp_path: Path) -> None:
    summary, run = _import(tmp_path, DATA / "test_traces")
    # test_system_metric_reader.py: 78 events, 68 of type cpu; 10 up to 1591167699 s; 32 from 1591748165 s
    assert summary.nodes["algo-1"].lines == 78
    assert summary.nodes["algo-1"].lines_by_type == Counter({"cpu": 68, "gpu": 10})
    assert _values(run) == 78
    assert _values(run, prefix="cpu") == 68
    assert _values(run, 1591100000, 1591167699) == 10
    assert _values(run, 1591748165, 1600000000) == 32
    # test_algorithm_metric_readers.py: 4 events between 1589930980 and 1589930995 s
    events = run.framework()
    assert events.num_rows == 4
    assert _events_in(run, 1589930980 * S, 1589930995 * S) == 4
    assert events["name"].cast("string").to_pylist() == ["event1", "event2", "event3", "event4"]
    assert events["start_us"].to_pylist()[0] == 1589930987655184 + 1008335
    assert run.nodes == ["algo-1"]  # the process "4487" names no host: it is the only node's
    # the 32 cores of one round share a timestamp: one snapshot, and the node's CPU their mean
    wide = run.system_wide("algo-1", start_us=1591748109 * S, end_us=1591748110 * S)
    assert wide.num_rows == 1
    cores = [wide[f"cpu{i}/cpu_util"][0].as_py() for i in range(32)]
    assert wide["cpu/cpu_util"][0].as_py() == pytest.approx(sum(cores) / 32, abs=0.01)


def test_one_minute_file_and_its_corrupt_copy(tmp_path: Path) -> None:
    for name, total, cpu, late, corrupt in (("1591160699.algo-1.json", 14, 4, 2, 0),
                                            ("1591160699.algo-1.json.corrupt", 13, 4, 1, 1)):
        src = tmp_path / name / "profiler-output"
        target = src / "system" / "incremental" / "2020060305" / "1591160699.algo-1.json"
        target.parent.mkdir(parents=True)
        shutil.copy(DATA / name, target)
        summary, run = _import(tmp_path / name, src)
        # test_system_profiler_file_parser.py: 14 (13) events, 4 cpu, 11 up to 1591167699.9572 s,
        # 2 (1) gpu from 1591169699.4579 s; the half-written last line is skipped, not an error
        assert _values(run) == total
        assert _values(run, prefix="cpu") == cpu
        assert _values(run, 0, 1591167699.9572) == 11
        assert _values(run, 1591169699.4579, 2591167699.9572, prefix="gpu") == late
        assert summary.nodes["algo-1"].corrupt_last_lines == corrupt
        assert summary.nodes["algo-1"].corrupt_lines == corrupt


def test_model_timelines_of_an_old_process_id(tmp_path: Path) -> None:
    summary, run = _import(tmp_path, DATA / "model_timeline_traces")
    events = run.framework()
    assert events.num_rows == 109  # 56 + 1 + 52 complete events in the three files
    # test_LocalMetricsReader_Model_timeline: 54 events in [1590461127873222, 1590461139949971], node "0001"
    assert _events_in(run, 1590461127873222, 1590461139949971) == 54
    assert run.nodes == ["0001"]
    assert Counter(events["kind"].cast("string").to_pylist()) == {"data_iterator": 100, "collective": 9}


def test_horovod_timelines(tmp_path: Path) -> None:
    summary, run = _import(tmp_path, DATA / "horovod_timeline_traces")
    events = run.framework()
    # test_horovodprofiler_events.py: 19 events, 12 in [1593673051473000, 1593673051473228], first start
    # 1592860696000713, last end 1593673051473228; the reader test's 15 in [..472800, ..473100]
    assert events.num_rows == 19
    assert _events_in(run, 1593673051473000, 1593673051473228) == 12
    assert _events_in(run, 1593673051472800, 1593673051473100) == 15
    assert min(events["start_us"].to_pylist()) == 1592860696000713
    assert max(events["end_us"].to_pylist()) == 1593673051473228
    assert set(events["kind"].cast("string").to_pylist()) == {"collective"}
    assert run.nodes == ["8c859046be41.ant.amazon.com"] and run.ranks() == {"8c859046be41.ant.amazon.com": ["88359"]}
    stats = summary.processes[0].by_file_kind["horovod_timeline"]
    assert (stats.unmatched_begin, stats.unmatched_end, stats.skipped_phases) == (4, 2, Counter({"i": 2}))
    tensors = {json.loads(a)["tensor"] for a in events["args"].to_pylist()}
    assert "Adam_Allreduce/HorovodAllreduce_gradient_tape_model_dense_1_BiasAdd_BiasAddGrad_0" in tensors


def test_steps_with_their_phases(tmp_path: Path) -> None:
    summary, run = _import(tmp_path, DATA / "merge_traces")
    events = run.framework()
    kinds = events["kind"].cast("string").to_pylist()
    modes = events["mode"].cast("string").to_pylist()
    steps = [(m, s) for k, m, s in zip(kinds, modes, events["step"].to_pylist()) if k == "step"]
    assert Counter(m for m, _ in steps) == {"TRAIN": 30, "EVAL": 10}
    assert sorted(s for m, s in steps if m == "TRAIN") == list(range(30))
    assert sorted(s for m, s in steps if m == "EVAL") == list(range(10))
    assert Counter(kinds) == {"data_iterator": 662, "step": 40}
    assert min(events["start_us"].to_pylist()) == 1594662608090195
    assert max(events["end_us"].to_pylist()) == 1594662624718694
    assert run.ranks() == {"b88ab1bb8259": ["905"]}
    # an event inside a step carries the step's mode and number; outside steps it is GLOBAL, without one
    starts, ends = events["start_us"].to_pylist(), events["end_us"].to_pylist()
    step_spans = [(st, en, m, n) for st, en, k, m, n in zip(starts, ends, kinds, modes, events["step"].to_pylist())
                  if k == "step"]
    for st, k, m, n in zip(starts, kinds, modes, events["step"].to_pylist()):
        if k == "step":
            continue
        inside = [(sm, sn) for a, b, sm, sn in step_spans if a <= st <= b]
        assert (m, n) == (inside[0] if inside else ("GLOBAL", None))
    assert sum(1 for k, m in zip(kinds, modes) if k != "step" and m == "TRAIN") > 0


def test_file_name_in_nanoseconds(tmp_path: Path) -> None:
    name = "1589314018481947000_1234-testhost_model_timeline.json"
    src = tmp_path / "out"
    (src / "framework" / "pevents" / "2020051220").mkdir(parents=True)
    shutil.copy(DATA / name, src / "framework" / "pevents" / "2020051220" / name)
    summary, run = _import(tmp_path, src)
    assert summary.processes[0].by_file_kind["model_timeline"].files == 1
    events = run.framework()
    # test_smtfprofiler_events.py: 49 events, 39 up to 1589314018.4700 s, first start 1589314018458743,
    # last end 1589314018481947, node id "1234-testhost"
    assert events.num_rows == 49
    assert _events_in(run, 0, 1589314018470000) == 39
    assert min(events["start_us"].to_pylist()) == 1589314018458743
    assert max(events["end_us"].to_pylist()) == 1589314018481947
    assert run.ranks() == {"testhost": ["1234"]}


def test_tensorflow_detailed_profiling_and_cprofile(tmp_path: Path) -> None:
    summary, run = _import(tmp_path, DATA / "tfprofiler_timeline_traces")
    detailed = run.profiles("detailed")
    assert len(detailed) == 1
    w = detailed[0]
    assert (w["node"], w["rank"], w["start_us"], w["end_us"]) == \
        ("8c859046be41.ant.amazon.com", 80807, 1596659864545103, 1596659864854168)
    trace = json.loads(gzip.decompress((tmp_path / "run" / w["path"] / "trace.json.gz").read_bytes()))
    assert trace["baseTimeNanoseconds"] == 1596659864545103 * 1000
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    # test_tfprofiler_events.py: 798 events, the first starting 21307 µs and the last ending 293205 µs
    # after the profiler's start
    assert len(xs) == 798
    assert min(e["ts"] for e in xs) == 21307
    assert max(e["ts"] + e["dur"] for e in xs) == 293205
    operators = run.operators()
    assert sum(operators["calls"].to_pylist()) == 798  # every event is on /host:CPU
    assert set(operators["device"].cast("string").to_pylist()) == {"cpu"}
    # three cProfile windows of process 151-algo-1, each with every function of its stats
    python = run.profiles("python")
    assert [(p["node"], p["rank"], p["first_step"]) for p in python] == [("algo-1", 151, None), ("algo-1", 151, 2),
                                                                         ("algo-1", 151, 3)]
    for p in python:
        stats = pstats.Stats(str(DATA / "tfprofiler_timeline_traces" / p["imported"]["source"]))
        functions = run.functions(window=p["window"])
        assert functions.num_rows == len(stats.stats)  # type: ignore[attr-defined]
        assert pc.sum(functions["self_us"]).as_py() == pytest.approx(stats.total_tt * 1e6, rel=1e-9)  # type: ignore
        assert run.location.read(p["path"] + "/profile.pstats") == \
            (DATA / "tfprofiler_timeline_traces" / p["imported"]["source"]).read_bytes()
    # TensorBoard's protobuf summaries have no counterpart: counted, not imported
    assert sum(1 for f in summary.other_files if f.endswith(".pb")) == 4


def test_trace_without_metadata(tmp_path: Path) -> None:
    summary, run = _import(tmp_path, DATA / "tfprofiler_local_missing_metadata")
    (w,) = run.profiles("detailed")
    assert w["node"] == "ip-172-31-19-241"
    assert w["start_us"] == 1596634664 * S  # its directory 2020_08_05_13_37_44, UTC, whole seconds
    assert w["imported"]["time_base"].startswith("directory name")


def test_windows_of_a_run_without_system_data_reach_the_timeline(tmp_path: Path) -> None:
    """Every node holding a window has a node record, so readers that go node by node (the timeline) see it."""
    from stallwatch.present.trace_export import export_timeline

    _, run = _import(tmp_path, DATA / "tfprofiler_timeline_traces")
    assert run.nodes == ["8c859046be41.ant.amazon.com", "algo-1"]
    record = run.info["nodes"]["8c859046be41.ant.amazon.com"]
    assert (record["start_us"], record["end_us"]) == (1596659864545103, 1596659864854168)
    summary = export_timeline(run, tmp_path / "timeline.json")
    assert (summary.profiler_windows, summary.profiler_events) == (1, 798)
    events = json.loads((tmp_path / "timeline.json").read_text())["traceEvents"]
    origin = summary.origin_us
    first = min(e["ts"] for e in events if e.get("ph") == "X")
    assert first + origin == 1596659864545103 + 21307  # on the wall clock, from baseTimeNanoseconds
