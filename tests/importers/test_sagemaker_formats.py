"""SageMaker's file conventions, one by one, on output written the way SageMaker wrote it (tests/importers/
sagemaker_output.py): time units, half-written lines, events split across files, rounds split across minute
files, the metric mapping and what has no counterpart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stallwatch.importers.sagemaker.importer import import_sagemaker
from stallwatch.importers.sagemaker.timestamps import epoch_to_us, epoch_from_text
from stallwatch.store.reader import open_run
from tests.importers.sagemaker_output import Round, system_line, trace_file, write_rounds, write_system_file, write_trace

S = 1_000_000
T0 = 1_700_000_000 * S  # 2023-11-14T22:13:20Z, a whole minute


def _round(t_us: int, k: int, cores: int = 4, gpus: int = 2) -> Round:
    """Planted values: core i at 10*i + k, its I/O wait k, GPU g at 50 + g + k, …"""
    return Round(t_us, [10.0 * i + k for i in range(cores)], [float(k)] * cores, [50.0 + g + k for g in range(gpus)],
                 [20.0 + g for g in range(gpus)], 30.0 + k, 1000.0 * k, 2000.0 * k, (100.0 * k, 7.0), (50.0, 3.0 * k))


def _import(tmp_path: Path, src: Path):
    summary = import_sagemaker(str(src), str(tmp_path / "run"))
    return summary, open_run(str(tmp_path / "run"))


def test_epoch_units_by_magnitude() -> None:
    us = 1_589_314_018_481_947
    assert epoch_to_us(us / 1e6) == us
    assert epoch_to_us(us) == us
    assert epoch_to_us(us * 1000) == us
    assert epoch_to_us(us // 1000) == us // 1000 * 1000  # milliseconds
    assert epoch_from_text("1596585363775342.0") == 1596585363775342
    assert epoch_from_text("1589314018481947000") == us
    assert epoch_from_text("1591160699") == 1591160699 * S
    assert epoch_from_text("algo") is None


@pytest.mark.parametrize("unit", ["s", "us", "ns"])
def test_system_timestamps_in_any_unit(tmp_path: Path, unit: str) -> None:
    src = tmp_path / "src"
    write_rounds(src, "algo-1", [_round(T0 + i * 500_000, i) for i in range(10)], unit=unit)
    summary, run = _import(tmp_path, src)
    wide = run.system_wide("algo-1")
    # every round is one snapshot at its first line's time (the I/O values' in this writer)
    assert wide["timestamp_us"].to_pylist() == [T0 + i * 500_000 for i in range(10)]
    assert summary.nodes["algo-1"].sample_interval_ms == 500
    assert open_run(str(tmp_path / "run")).info["nodes"]["algo-1"]["sample_interval_ms"] == 500


def test_metric_mapping_and_derived_series(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_rounds(src, "algo-1", [_round(T0 + i * 1_000_000, i) for i in range(5)])
    summary, run = _import(tmp_path, src)
    wide = run.system_wide("algo-1")
    k = 3
    row = {c: wide[c][k].as_py() for c in wide.column_names}
    assert row["cpu2/cpu_util"] == 23.0 and row["cpu2/cpu_iowait"] == 3.0
    assert row["cpu/cpu_util"] == pytest.approx(np.mean([3, 13, 23, 33]), abs=0.01)  # the cores' mean
    assert row["cpu/cpu_iowait"] == 3.0
    assert row["gpu1/gpu_util"] == 54.0 and row["gpu1/gpu_mem_util"] == 21.0
    assert row["memory/mem_util"] == 33.0
    assert row["disk/disk_read_bps"] == 3000.0 and row["disk/disk_write_bps"] == 6000.0
    assert row["net_algorithm/net_rx_bps"] == 300.0 and row["net_platform/net_rx_bps"] == 7.0
    assert row["net/net_rx_bps"] == 307.0 and row["net/net_tx_bps"] == 50.0 + 9.0  # the two attributions summed
    node = run.info["nodes"]["algo-1"]
    assert node["cpu_cores_logical"] == 4 and [g["index"] for g in node["gpus"]] == [0, 1]
    assert summary.nodes["algo-1"].unmapped == {}


def test_series_without_counterpart_are_counted(tmp_path: Path) -> None:
    src = tmp_path / "src"
    lines = [system_line("cpu", "cpu0", "CPUUtilization", 5.0, "algo-1", T0 / S),
             system_line("gpu", "gpu0", "GPUTemperature", 60.0, "algo-1", T0 / S),
             system_line("i/o", "IOPS", "", 120.0, "algo-1", T0 / S)]
    write_system_file(src, "algo-1", T0 // S, lines)
    summary, run = _import(tmp_path, src)
    assert summary.nodes["algo-1"].unmapped == {"gpu/gpu0/GPUTemperature": 1}
    assert any("GPUTemperature" in loss for loss in summary.losses)
    wide = run.system_wide("algo-1")
    assert wide["disk/disk_iops"].to_pylist() == [120.0]


def test_a_round_split_across_minute_files_is_one_snapshot(tmp_path: Path) -> None:
    src = tmp_path / "src"
    r = _round(T0 + 59_999_000, 1)  # its I/O lines at 59.999 s, the rest after the minute
    lines = r.lines("algo-1")
    write_system_file(src, "algo-1", T0 // S, lines[:2])
    write_system_file(src, "algo-1", T0 // S + 60, lines[2:] + _round(T0 + 60_999_000, 2).lines("algo-1"))
    summary, run = _import(tmp_path, src)
    wide = run.system_wide("algo-1")
    assert wide.num_rows == 2
    assert wide["disk/disk_read_bps"].to_pylist() == [1000.0, 2000.0]
    assert wide["gpu0/gpu_util"].to_pylist() == [51.0, 52.0]


def test_a_series_repeated_within_the_gap_starts_a_new_snapshot(tmp_path: Path) -> None:
    """The public fixture 1591160699.algo-1.json has such lines: nothing is merged away."""
    src = tmp_path / "src"
    lines = [system_line("gpu", "gpu0", "GPUUtilization", v, "algo-1", (T0 + i * 10_000) / S)
             for i, v in enumerate([1.0, 2.0, 3.0])]
    write_system_file(src, "algo-1", T0 // S, lines)
    summary, run = _import(tmp_path, src)
    assert run.system_wide("algo-1")["gpu0/gpu_util"].to_pylist() == [1.0, 2.0, 3.0]
    assert summary.nodes["algo-1"].values_stored == 3


def test_system_corrupt_lines(tmp_path: Path) -> None:
    src = tmp_path / "src"
    good = [system_line("cpu", "cpu0", "CPUUtilization", float(i), "algo-1", (T0 + i * S) / S) for i in range(6)]
    write_system_file(src, "algo-1", T0 // S, good[:3] + ['{"Type": "cpu", "Name": "cpu0", "Dimen'] + good[3:],
                      tail='{"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Val')
    summary, run = _import(tmp_path, src)
    assert run.system_wide("algo-1")["cpu0/cpu_util"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    stats = summary.nodes["algo-1"]
    assert (stats.corrupt_lines, stats.corrupt_last_lines) == (2, 1)
    assert len(summary.losses) == 1 and "2 system line(s)" in summary.losses[0]


def test_a_new_series_later_in_the_job(tmp_path: Path) -> None:
    """GPU metrics that start in the second minute: the run's later files have the new columns."""
    src = tmp_path / "src"
    write_system_file(src, "algo-1", T0 // S, [system_line("cpu", "cpu0", "CPUUtilization", 1.0, "algo-1", T0 / S)])
    write_system_file(src, "algo-1", T0 // S + 60, [
        system_line("cpu", "cpu0", "CPUUtilization", 2.0, "algo-1", T0 / S + 60),
        system_line("gpu", "gpu0", "GPUUtilization", 9.0, "algo-1", T0 / S + 60)])
    _, run = _import(tmp_path, src)
    wide = run.system_wide("algo-1")
    assert wide["cpu0/cpu_util"].to_pylist() == [1.0, 2.0]
    assert [None if v is None or np.isnan(v) else v for v in wide["gpu0/gpu_util"].to_pylist()] == [None, 9.0]


def _steps(base_us: int, n: int, mode: str = "TRAIN", every_us: int = 100_000, pid: int = 1) -> list[dict]:
    return [{"name": f"Step:ModeKeys.{mode}", "pid": pid, "ph": "X", "ts": i * every_us, "dur": every_us - 10_000,
             "args": {"pid": 4242, "step_num": str(i)}} for i in range(n)]


@pytest.mark.parametrize("unit", ["s", "us", "ns"])
def test_trace_file_names_and_start_times_in_any_unit(tmp_path: Path, unit: str) -> None:
    src = tmp_path / "src"
    end_us = T0 + 10 * S
    name_time = {"s": str(end_us // S), "us": str(end_us), "ns": str(end_us * 1000)}[unit]
    base = {"s": T0 / S, "us": T0, "ns": T0 * 1000}[unit]
    path = trace_file(src, "0-algo-1", "pythontimeline.json", end_us, name_time=name_time)
    write_trace(path, base, {1: "Step:ModeKeys.TRAIN"}, _steps(0, 5))
    summary, run = _import(tmp_path, src)
    steps = run.framework()
    assert steps["start_us"].to_pylist() == [T0 + i * 100_000 for i in range(5)]
    assert steps["step"].to_pylist() == list(range(5))
    assert steps["pid"].to_pylist() == [4242] * 5
    assert run.ranks() == {"algo-1": ["0"]}
    assert run.info["nodes"]["algo-1"]["ranks"] == [{"rank": 0, "pid": 4242}]


def test_step_numbers_no_column_holds_import_without_a_number(tmp_path: Path) -> None:
    """10^30, a negative or an infinite step_num (a corrupt or hostile file) imports as a step without its number,
    never an OverflowError and a half-written run."""
    src = tmp_path / "src"
    steps = _steps(0, 4)
    steps[1]["args"]["step_num"] = 10 ** 30
    steps[2]["args"]["step_num"] = -3
    steps[3]["args"]["step_num"] = float("inf")
    path = trace_file(src, "0-algo-1", "pythontimeline.json", T0 + S)
    write_trace(path, T0, {1: "Step:ModeKeys.TRAIN"}, steps)
    _, run = _import(tmp_path, src)
    assert run.framework(kinds=["step"]).num_rows == 4


def test_events_split_across_files(tmp_path: Path) -> None:
    """A begin event in one file and its end in the next one of the same process; the second file without
    its own start time keeps the first one's (SageMaker's readers did both)."""
    src = tmp_path / "src"
    phases = {1: "Step:ModeKeys.TRAIN", 2: "Forward"}
    first = trace_file(src, "0-algo-1", "pythontimeline.json", T0 + 1 * S)
    write_trace(first, T0, phases, _steps(0, 3) + [{"name": "Net", "pid": 2, "ph": "B", "ts": 210_000}])
    second = trace_file(src, "0-algo-1", "pythontimeline.json", T0 + 2 * S)
    write_trace(second, None, phases, [{"pid": 2, "ph": "E", "ts": 250_000}])
    summary, run = _import(tmp_path, src)
    events = run.framework(kinds=["forward"])
    assert events.num_rows == 1
    assert (events["start_us"][0].as_py(), events["end_us"][0].as_py()) == (T0 + 210_000, T0 + 250_000)
    assert (events["name"][0].as_py(), events["mode"][0].as_py(), events["step"][0].as_py()) == ("Net", "TRAIN", 2)
    stats = summary.processes[0].by_file_kind["pythontimeline"]
    assert (stats.files, stats.unmatched_begin, stats.unmatched_end) == (2, 0, 0)


def test_trace_corrupt_and_unclosed_files(tmp_path: Path) -> None:
    """A killed job's last file: no closing bracket and a half-written last line; only that line is lost
    (SageMaker's reader dropped the whole file)."""
    src = tmp_path / "src"
    path = trace_file(src, "0-algo-1", "pythontimeline.json", T0 + S)
    write_trace(path, T0, {1: "Step:ModeKeys.TRAIN"}, _steps(0, 4), close=False,
                tail='{"name": "Step:ModeKeys.TRAIN", "pid": 1, "ph": "X", "ts": 40')
    summary, run = _import(tmp_path, src)
    assert run.framework()["step"].to_pylist() == [0, 1, 2, 3]
    stats = summary.processes[0].by_file_kind["pythontimeline"]
    assert (stats.corrupt_lines, stats.corrupt_last_lines) == (1, 1)


def test_pytorch_phases_and_dataloader_events(tmp_path: Path) -> None:
    src = tmp_path / "src"
    phases = {1: "Step:ModeKeys.TRAIN", 2: "Forward", 3: "Backward(post-forward)", 4: "DataLoaderIter",
              5: "gpu_functions-dev:0", 6: "SomethingElse"}
    events = _steps(0, 2) + [
        {"name": "Net", "pid": 2, "ph": "X", "ts": 20_000, "dur": 30_000, "args": {"step_num": "0"}},
        {"name": "Net", "pid": 3, "ph": "X", "ts": 50_000, "dur": 30_000, "args": {"step_num": "0"}},
        {"name": "_MultiProcessingDataLoaderIter.DataLoaderIter::GetNext", "pid": 4, "ph": "X", "ts": 1_000,
         "dur": 15_000},
        {"name": "volta_sgemm", "pid": 5, "ph": "X", "ts": 55_000, "dur": 1_000},
        {"name": "custom", "pid": 6, "ph": "X", "ts": 500_000, "dur": 1_000, "args": {"x": 1}},
    ]
    write_trace(trace_file(src, "3-algo-2", "pythontimeline.json", T0 + S), T0, phases, events)
    _, run = _import(tmp_path, src)
    t = run.framework()
    rows = {(k, n): (m, s, a) for k, n, m, s, a in zip(t["kind"].cast("string").to_pylist(),
                                                       t["name"].cast("string").to_pylist(),
                                                       t["mode"].cast("string").to_pylist(), t["step"].to_pylist(),
                                                       t["args"].to_pylist())}
    assert rows[("forward", "Net")][:2] == ("TRAIN", 0)
    assert rows[("backward", "Net")][:2] == ("TRAIN", 0)
    assert rows[("data_wait", "_MultiProcessingDataLoaderIter.DataLoaderIter::GetNext")][:2] == ("TRAIN", 0)
    assert json.loads(rows[("gpu_op", "volta_sgemm")][2]) == {"device": "0"}
    assert rows[("other", "custom")][:2] == ("GLOBAL", None)  # after the last step ended
    assert json.loads(rows[("other", "custom")][2]) == {"phase": "SomethingElse", "x": 1}
    assert run.ranks() == {"algo-2": ["3"]}


def test_tensorflow_window_gets_the_steps_it_covers(tmp_path: Path) -> None:
    """A detailed-profiling trace of process 0-algo-1 written while its TRAIN steps 3-5 ran; nested host ops
    and a GPU kernel give the operator totals."""
    import gzip

    src = tmp_path / "src"
    write_trace(trace_file(src, "0-algo-1", "pythontimeline.json", T0 + S), T0, {1: "Step:ModeKeys.TRAIN"},
                _steps(0, 8))
    step_dir = src / "framework" / "tensorflow" / "detailed_profiling" / "2023111422" / "000000003"
    start, end = T0 + 300_000, T0 + 590_000
    (step_dir / "plugins" / "profile" / "2023_11_14_22_13_20").mkdir(parents=True)
    (step_dir / f"0-algo-1_{start}_{end}.metadata").write_text("")
    trace = {"displayTimeUnit": "ns", "traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 100, "dur": 50, "name": "model/dense/MatMul:MatMul"},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 110, "dur": 20, "name": "model/dense/BiasAdd:BiasAdd"},
        {"ph": "X", "pid": 2, "tid": 1, "ts": 120, "dur": 30, "name": "volta_sgemm"},
    ]}
    (step_dir / "plugins" / "profile" / "2023_11_14_22_13_20" / "algo-1.trace.json.gz").write_bytes(
        gzip.compress(json.dumps(trace).encode()))
    _, run = _import(tmp_path, src)
    (w,) = run.profiles("detailed")
    assert (w["node"], w["rank"], w["start_us"], w["end_us"]) == ("algo-1", 0, start, end)
    assert (w["mode"], w["first_step"], w["last_step"]) == ("TRAIN", 3, 5)
    assert w["activities"] == ["cpu", "cuda"]
    ops = {(o, d): (c, su, tu) for o, d, c, su, tu in zip(*(run.operators()[k].to_pylist() for k in
                                                              ("operator", "device", "calls", "self_us", "total_us")))}
    assert ops[("model/dense/MatMul:MatMul", "cpu")] == (1, 30.0, 50.0)  # less its child's 20 µs
    assert ops[("model/dense/BiasAdd:BiasAdd", "cpu")] == (1, 20.0, 20.0)
    assert ops[("volta_sgemm", "cuda")] == (1, 30.0, 30.0)


def test_lines_are_read_in_bounded_blocks(tmp_path: Path) -> None:
    """Blocks end at line ends; a line longer than the limit is skipped and said, the rest is read."""
    from stallwatch.importers.sagemaker.lines import line_blocks
    from stallwatch.store.location import RunLocation

    (tmp_path / "f").write_bytes(b"a" * 10 + b"\n" + b"b" * 300 + b"\n" + b"c" * 5 + b"\n" + b"half")
    long_lines = []
    blocks = list(line_blocks(RunLocation(str(tmp_path)), "f", block_bytes=64, max_line=100,
                              on_long_line=lambda: long_lines.append(1)))
    assert b"".join(b for b, _ in blocks) == b"a" * 10 + b"\n" + b"c" * 5 + b"\n" + b"half"
    assert [last for _, last in blocks][-1] is True and not any(last for _, last in blocks[:-1])
    assert all(b.endswith(b"\n") for b, last in blocks if not last)
    assert long_lines == [1]
