"""`stallwatch timeline`: a generated two-node run (system snapshots and framework events written by the
store's own writers) exported to Chrome-trace JSON and read back: valid Trace Event Format, named tracks,
counters per metric, steps enclosing their phases, one time axis for all nodes, bounded counters that keep a
planted spike, a cap on events that cuts time alike on every node; and a real torch run whose
detailed-profiling window lands inside the step it profiled."""

from __future__ import annotations

import gzip
import json
import logging
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallwatch.cli import main
from stallwatch.present.trace_export import export_timeline, resolve_time
from stallwatch.records import FrameworkEvent, MetricKey
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run
from stallwatch.store.system_writer import SystemWriter

from ..analyze.rules._fw_gen import MS, T0, FwGen, S
from ..analyze.rules._gen import make_node
from ..run_builder import node_record, run_record, write_node_json

NODES = ("algo-1", "algo-2")
SNAPSHOTS = 4000  # at 500 ms: 33 minutes, more than one 10-minute segment
INTERVAL_US = 500 * MS
NODE2_LATE_S = 3  # algo-2's sampler starts 3 s after algo-1's
STEPS_AT = T0 + 10 * S  # both nodes' ranks start stepping at the same absolute time
SPIKE_AT, DIP_AT = 1234, 2345  # snapshot indices on algo-1: gpu0 at 100 %, then at 0 %
ODD = '<script>alert(1)</script> "quoted" \\back\\slash\nnew line \u2028 ünïcødé 🚀'
PHASES = ("data_wait", "forward", "backward", "optimizer")


# -- a generated run -----------------------------------------------------------------------------------------


def _write_system(location: RunLocation, node: str, index: int) -> None:
    frame = make_node(node, n=SNAPSHOTS, cores=2, gpus=2, seed=index, start_us=T0 + index * NODE2_LATE_S * S,
                      interval_us=INTERVAL_US)
    if index == 0:
        frame.columns["gpu0/gpu_util"][SPIKE_AT] = 100.0
        frame.columns["gpu0/gpu_util"][DIP_AT] = 0.0
    names = sorted(frame.columns)
    writer = SystemWriter(location, node, [MetricKey.from_column(c) for c in names], interval_us=INTERVAL_US,
                          flush_interval_us=60 * S, max_bytes=1 << 30)
    for i, ts in enumerate(frame.timestamps.tolist()):
        writer.append(ts, [float(frame.columns[c][i]) for c in names])
        writer.tick(ts)
    writer.close()
    record = node_record(node, int(frame.timestamps[0]), int(frame.timestamps[-1]) + INTERVAL_US, samples=SNAPSHOTS)
    record.update(gpus=[{"index": g, "name": "Generated GPU"} for g in range(2)], sample_interval_ms=500,
                  metrics=names)
    write_node_json(location, record)


def _events() -> FwGen:
    gen = FwGen()
    for node in NODES:
        for rank in (0, 1):
            gen.dataloader(node=node, rank=rank, at_us=STEPS_AT - 5 * MS, num_workers=2)
            starts, _ = gen.steps(node=node, rank=rank, n=200, start_us=STEPS_AT, seed=rank, slow={50: 400 * MS})
            # DDP's timing of a sampled iteration: it straddles the end of step 10, so it cannot nest there.
            gen.events(node, rank, "collective", "ddp_gradient_all_reduce", "TRAIN", None,
                       int(starts[10]) + 60 * MS, int(starts[11]) + 20 * MS, json.dumps({"iteration": 10}))
            for w in range(2):  # data-loader workers' fetches, on their own threads
                gen.events(node, rank, "fetch", f"worker{w}", "GLOBAL", None, starts[:20] + w * MS,
                           starts[:20] + 30 * MS, json.dumps({"worker": w, "samples": 32}), pid=5000 + w)
    gen.events("algo-1", 0, "collective", ODD, "TRAIN", 3, STEPS_AT + 340 * MS, STEPS_AT + 345 * MS,
               '{"bytes": NaN, "odd": "' + ODD.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"}')
    gen.events("algo-1", 0, "collective", "all_reduce", "TRAIN", 4, STEPS_AT + 450 * MS, STEPS_AT + 451 * MS,
               "{not json")
    return gen


def _write_events(location: RunLocation, gen: FwGen) -> list[dict[str, Any]]:
    rows = gen.table().to_pylist()
    writers: dict[tuple[str, int], FrameworkWriter] = {}
    for r in rows:
        w = writers.get((r["node"], r["rank"]))
        if w is None:
            w = writers[(r["node"], r["rank"])] = FrameworkWriter(location, r["node"], r["rank"],
                                                                  flush_interval_us=60 * S, max_bytes=1 << 30)
        w.append(FrameworkEvent(r["kind"], r["name"], r["start_us"], r["end_us"], r["mode"], r["step"], r["pid"],
                                r["args"]))
    for w in writers.values():
        w.close()
    return rows


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("timeline") / "run-gen"
    location = RunLocation(str(root))
    location.write_atomic("run.json", json.dumps(run_record(root.name, NODES[0], T0)).encode())
    for i, node in enumerate(NODES):
        _write_system(location, node, i)
    return root, _write_events(location, _events())


def _load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.name.endswith(".gz") else raw).decode("utf-8")

    def no_constants(name: str) -> Any:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=no_constants)


@pytest.fixture(scope="module")
def exported(generated, tmp_path_factory) -> dict[str, Any]:
    root, _ = generated
    out = tmp_path_factory.mktemp("out") / "trace.json.gz"
    export_timeline(open_run(str(root)), out)
    return _load(out)


# -- reading the trace back ----------------------------------------------------------------------------------


class Trace:
    """A loaded trace with its names resolved."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.events = doc["traceEvents"]
        meta = [e for e in self.events if e["ph"] == "M"]
        self.processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
        self.threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
        self.thread_pid = {e["tid"]: e["pid"] for e in meta if e["name"] == "thread_name"}

    def pid(self, name: str) -> int:
        (pid,) = [p for p, n in self.processes.items() if n == name]
        return pid

    def on(self, process: str, thread: str) -> list[dict[str, Any]]:
        pid = self.pid(process)
        return [e for e in self.events
                if e["ph"] != "M" and e["pid"] == pid and self.threads.get(e.get("tid")) == thread]

    def counters(self, process: str) -> dict[str, list[dict[str, Any]]]:
        pid = self.pid(process)
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in self.events:
            if e["ph"] == "C" and e["pid"] == pid:
                (unit,) = e["args"]
                out[f"{e['name']} {unit}"].append(e)
        return dict(out)

    @property
    def origin(self) -> int:
        return self.doc["otherData"]["origin_us"]


def assert_valid_trace_event_format(doc: dict[str, Any]) -> None:
    """What Chrome's and Perfetto's JSON importers need: per phase its fields and types, names for every
    process and thread used, ids never shared between a process and a thread, and slices that nest."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    number = (int, float)
    pids, tids, used = set(), set(), set()
    for e in doc["traceEvents"]:
        ph = e["ph"]
        assert ph in {"M", "X", "C", "i", "I", "s", "t", "f"}, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["ts"], number), e
        assert "name" in e and isinstance(e["name"], str), e
        if ph == "M":
            assert e["name"] in {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}
            assert isinstance(e["args"], dict)
            (pids if e["name"].startswith("process") else tids).add(e["pid"] if e["name"].startswith("process")
                                                                    else e["tid"])
        elif ph == "X":
            assert isinstance(e["dur"], number) and e["dur"] >= 0, e
            used.add(e["tid"])
        elif ph == "C":
            assert e["args"] and all(isinstance(v, number) for v in e["args"].values()), e
        elif ph in "iI":
            assert e.get("s", "t") in {"t", "p", "g"}, e
        else:
            assert isinstance(e["id"], int), e
    assert not pids & tids, "a process id is also a thread id"
    assert used <= tids, "a thread without a name"
    by_thread: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_thread[e["tid"]].append(e)
    for tid, slices in by_thread.items():
        open_ends: list[float] = []
        for e in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            end = e["ts"] + e["dur"]
            assert not open_ends or end <= open_ends[-1] + 1e-3, f"thread {tid}: {e} crosses an enclosing slice"
            open_ends.append(end)


# -- the generated run -----------------------------------------------------------------------------------------


def test_the_export_is_valid_trace_event_format(exported):
    assert_valid_trace_event_format(exported)
    assert exported["displayTimeUnit"] == "ms"


def test_a_process_per_node_and_its_system_and_a_thread_per_rank(exported):
    t = Trace(exported)
    assert sorted(t.processes.values()) == ["node algo-1", "node algo-2", "system algo-1", "system algo-2"]
    for node in NODES:
        pid = t.pid(f"node {node}")
        names = {n for tid, n in t.threads.items() if t.thread_pid[tid] == pid}
        assert {"rank 0", "rank 1", "rank 0 · data worker0", "rank 1 · data worker1"} <= names
        steps = [e for e in t.on(f"node {node}", "rank 1") if e.get("cat") == "step"]
        assert [e["args"]["step"] for e in steps] == list(range(200))
        assert {e["name"] for e in steps} == {"train_step"} and {e["args"]["mode"] for e in steps} == {"TRAIN"}


def test_counter_tracks_per_metric_with_the_stored_values(exported, generated):
    t = Trace(exported)
    counters = t.counters("system algo-1")
    assert sorted(counters) == sorted([
        "CPU util %", "CPU I/O wait %", "memory used %", "gpu0 util %", "gpu1 util %", "gpu0 memory used %",
        "gpu1 memory used %", "disk read MB/s", "disk write MB/s", "network received MB/s", "network sent MB/s"])
    assert t.counters("system algo-2").keys() == counters.keys()
    stored = open_run(str(generated[0])).system_wide("algo-1", metrics=["gpu_util", "disk_read_bps"])
    ts = stored["timestamp_us"].to_numpy() - t.origin
    gpu = [(e["ts"], e["args"]["%"]) for e in counters["gpu0 util %"]]
    assert gpu == [(int(a), float(b)) for a, b in zip(ts, stored["gpu0/gpu_util"].to_numpy())]  # 4000 < 10000: all
    disk = np.array([e["args"]["MB/s"] for e in counters["disk read MB/s"]])
    np.testing.assert_allclose(disk, stored["disk/disk_read_bps"].to_numpy() / 1e6, rtol=1e-5)


def test_steps_enclose_their_phases_on_the_same_thread(exported):
    t = Trace(exported)
    events = t.on("node algo-2", "rank 0")
    index = {id(e): i for i, e in enumerate(exported["traceEvents"])}
    steps = {e["args"]["step"]: e for e in events if e.get("cat") == "step"}
    phases = [e for e in events if e.get("cat") in PHASES]
    assert len(phases) == 4 * len(steps) == 800
    for p in phases:
        step = steps[p["args"]["step"]]
        assert step["ts"] <= p["ts"] and p["ts"] + p["dur"] <= step["ts"] + step["dur"], (p, step)
        assert index[id(step)] < index[id(p)]  # the enclosing slice first, also at the same timestamp
    forward = next(p for p in phases if p["name"] == "forward")
    assert forward["args"]["name"] == "Net" and forward["cat"] == "forward"  # the module is kept in args


def test_each_phase_gets_the_catalogues_trace_colour(exported):
    """chrome://tracing colours a slice by its `cname`: each phase the one the catalogue gives it."""
    from stallwatch import catalogue

    events = Trace(exported).on("node algo-2", "rank 0")
    for e in (e for e in events if e.get("cat") in PHASES):
        assert e["cname"] == catalogue.phase(e["cat"]).trace_colour, e
    assert len({e["cname"] for e in events if e.get("cat") in PHASES}) == len(PHASES)
    assert all("cname" not in e for e in events if e.get("cat") == "step")


def test_an_event_that_cannot_nest_goes_to_an_extra_lane(exported):
    t = Trace(exported)
    (ddp,) = [e for e in t.on("node algo-1", "rank 1 · overlapping 1")]
    assert ddp["name"] == "ddp_gradient_all_reduce" and ddp["args"] == {"iteration": 10, "mode": "TRAIN"}
    assert all(e["name"] != "ddp_gradient_all_reduce" for e in t.on("node algo-1", "rank 1"))


def test_every_node_is_on_one_time_axis(exported):
    t = Trace(exported)
    assert t.origin == T0  # algo-1's first snapshot: the run's earliest time
    assert exported["otherData"]["origin_utc"] == "2025-11-22T05:40:00Z"
    first = {node: min(e["ts"] for e in t.on(f"node {node}", "rank 0") if e.get("cat") == "step") for node in NODES}
    assert first == {"algo-1": STEPS_AT - T0, "algo-2": STEPS_AT - T0}
    at = T0 + 20 * S  # a snapshot time both nodes have
    same = {node: [e["ts"] for e in t.counters(f"system {node}")["CPU util %"] if e["ts"] == at - T0] for node in NODES}
    assert same == {"algo-1": [at - T0], "algo-2": [at - T0]}
    assert min(e["ts"] for e in t.counters("system algo-2")["CPU util %"]) == NODE2_LATE_S * S


def test_dataloader_creation_is_an_instant_and_fetches_keep_their_worker(exported):
    t = Trace(exported)
    (loader,) = [e for e in t.on("node algo-1", "rank 0") if e.get("cat") == "dataloader"]
    assert loader["ph"] == "i" and loader["s"] == "t" and loader["args"]["num_workers"] == 2
    fetches = t.on("node algo-1", "rank 0 · data worker1")
    assert len(fetches) == 20 and {e["args"]["worker"] for e in fetches} == {1}


def test_odd_names_and_args_are_data(exported):
    t = Trace(exported)
    events = t.on("node algo-1", "rank 0")
    (odd,) = [e for e in events if e["name"] == ODD]
    assert odd["args"]["odd"] == ODD and odd["args"]["bytes"] == "nan" and odd["args"]["step"] == 3
    (broken,) = [e for e in events if e["name"] == "all_reduce"]
    assert broken["args"]["args"] == "{not json"


def test_counters_are_bounded_and_keep_a_spike_and_a_dip(generated, tmp_path):
    root, _ = generated
    out = tmp_path / "small.json"
    summary = export_timeline(open_run(str(root)), out, max_points=200)
    doc = _load(out)  # not gzipped: a plain .json name
    assert_valid_trace_event_format(doc)
    t = Trace(doc)
    for node in NODES:
        for name, points in t.counters(f"system {node}").items():
            assert 100 <= len(points) <= 200, name
    gpu = {e["ts"]: e["args"]["%"] for e in t.counters("system algo-1")["gpu0 util %"]}
    assert gpu[SPIKE_AT * INTERVAL_US] == 100.0 and gpu[DIP_AT * INTERVAL_US] == 0.0
    assert max(gpu.values()) == 100.0 and min(gpu.values()) == 0.0
    assert summary.counter_points == sum(len(p) for n in NODES for p in t.counters(f"system {n}").values())


def test_a_window_keeps_the_same_time_axis(generated, exported, tmp_path):
    root, _ = generated
    out = tmp_path / "window.json.gz"
    start, end = STEPS_AT + 2 * S, STEPS_AT + 4 * S
    export_timeline(open_run(str(root)), out, start_us=start, end_us=end)
    window, whole = Trace(_load(out)), Trace(exported)
    steps = [e for e in window.on("node algo-2", "rank 1") if e.get("cat") == "step"]
    assert steps and all(e["ts"] + e["dur"] > start - T0 and e["ts"] < end - T0 for e in steps)
    by_step = {e["args"]["step"]: e["ts"] for e in whole.on("node algo-2", "rank 1") if e.get("cat") == "step"}
    assert all(by_step[e["args"]["step"]] == e["ts"] for e in steps)  # same origin, same timestamps
    cpu = window.counters("system algo-1")["CPU util %"]
    assert [e["ts"] for e in cpu] == list(range(start - T0, end - T0, INTERVAL_US))


def test_max_events_cuts_time_alike_on_every_node(generated, tmp_path, caplog):
    root, rows = generated
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    out = tmp_path / "capped.json.gz"
    summary = export_timeline(open_run(str(root)), out, max_events=500)
    t = Trace(_load(out))
    framework = [e for e in t.events if e["ph"] in "Xi" and t.processes[e["pid"]].startswith("node ")]
    cut = summary.cut_us
    assert cut is not None and t.doc["otherData"]["framework_cut_us"] == cut
    expected = [r for r in rows if r["start_us"] < cut]
    assert 450 <= len(framework) == len(expected) == summary.framework_events <= 500
    assert sorted(e["ts"] for e in framework) == sorted(r["start_us"] - T0 for r in expected)
    for node in NODES:  # both nodes cut at the same time, not the first node filling the budget
        assert any(t.on(f"node {node}", "rank 1"))
    assert any("left out" in r.getMessage() and "--start/--end" in r.getMessage() for r in caplog.records)
    cpu = t.counters("system algo-1")["CPU util %"]
    assert cpu[-1]["ts"] == (SNAPSHOTS - 1) * INTERVAL_US  # the counters still cover the whole run


@pytest.mark.parametrize("cap", [1, 37, 500, 10_000_000])
def test_the_cut_is_the_runs_first_events_over_every_node_read_one_node_at_a_time(generated, cap):
    """The cut is where the run's `cap`-th event (by start, all nodes together) begins, though each node's starts
    are read on their own and only the earliest that can still be it are kept."""
    from stallwatch.present.trace_export import _event_cut

    root, rows = generated
    starts = sorted(r["start_us"] for r in rows)
    assert len({r["node"] for r in rows}) > 1
    assert _event_cut(open_run(str(root)), None, None, cap) == (starts[cap] if cap < len(starts) else None)


def test_all_metrics_adds_cores_and_bytes(generated, tmp_path):
    root, _ = generated
    out = tmp_path / "all.json.gz"
    export_timeline(open_run(str(root)), out, all_metrics=True, max_points=50)
    names = Trace(_load(out)).counters("system algo-1").keys()
    assert {"cpu0 util %", "cpu1 I/O wait %", "memory in use GB", "gpu1 memory in use GB", "CPU util %"} <= names


def test_resolve_time_takes_seconds_or_iso():
    assert resolve_time("90", T0) == T0 + 90 * S
    assert resolve_time("0.5", T0) == T0 + S // 2
    assert resolve_time("2025-11-22T05:41:00Z", 0) == T0 + 60 * S
    assert resolve_time("2025-11-22T05:41:00", 0) == T0 + 60 * S  # no zone: UTC
    with pytest.raises(ValueError, match="seconds from the run's start"):
        resolve_time("yesterday", T0, "--start")


# -- the command line ----------------------------------------------------------------------------------------


def test_the_command_writes_the_file_and_prints_its_path(generated, tmp_path, capsys):
    root, _ = generated
    out = tmp_path / "sub" / "cli.json.gz"
    assert main(["timeline", str(root), "-o", str(out), "--start", "10", "--end", "12", "--max-points", "100"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    doc = _load(out)
    assert_valid_trace_event_format(doc)
    assert doc["otherData"]["window_start_us"] == T0 + 10 * S and doc["otherData"]["window_end_us"] == T0 + 12 * S
    assert [p.name for p in out.parent.iterdir()] == ["cli.json.gz"]  # no temporary file left behind


def test_the_commands_defaults_are_the_exporters():
    from stallwatch.cli import build_parser
    from stallwatch.present.trace_export import DEFAULT_MAX_EVENTS, DEFAULT_MAX_POINTS

    args = build_parser().parse_args(["timeline", "some-run"])
    assert (args.max_points, args.max_events, args.profiler) == (DEFAULT_MAX_POINTS, DEFAULT_MAX_EVENTS, True)


def test_the_default_output_is_named_after_the_run(generated, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["timeline", str(generated[0]), "--no-profiler"]) == 0
    assert capsys.readouterr().out.strip() == "run-gen-timeline.json.gz"
    assert_valid_trace_event_format(_load(tmp_path / "run-gen-timeline.json.gz"))


def test_a_bad_run_or_window_is_a_clear_error(generated, tmp_path, capsys):
    assert main(["timeline", str(tmp_path / "nothing-here"), "-o", str(tmp_path / "x.json.gz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stallwatch timeline: ") and "is not a stallwatch run" in err
    assert main(["timeline", str(generated[0]), "--start", "60", "--end", "30"]) == 2
    assert "is not before --end" in capsys.readouterr().err
    assert main(["timeline", str(generated[0]), "--end", "soon"]) == 2
    assert "--end 'soon'" in capsys.readouterr().err
    assert not (tmp_path / "x.json.gz").exists()


# -- a real detailed-profiling window -------------------------------------------------------------------------

TORCH_JOB = '''
import sys, torch
import stallwatch.torch
from torch.utils.data import DataLoader
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
train = DataLoader(torch.randn(24, 8), batch_size=4)
with stallwatch.torch.profile(out=sys.argv[1], sample_interval_ms=100, flush_interval_s=1,
                              detailed_profiling="2:1") as prof:
    for xb in train:
        with prof.step("train"):
            opt.zero_grad(); model(xb).sum().backward(); opt.step()
'''


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("torch")
    (tmp / "job.py").write_text(TORCH_JOB)
    p = subprocess.run([sys.executable, str(tmp / "job.py"), str(tmp / "run")], capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stderr
    return tmp / "run"


def test_a_detailed_window_lands_inside_the_step_it_profiled(torch_run, tmp_path):
    run = open_run(str(torch_run))
    (window,) = run.profiles("detailed")
    node, rank = window["node"], window["rank"]
    out = tmp_path / "torch.json.gz"
    summary = export_timeline(run, out)
    doc = _load(out)
    assert_valid_trace_event_format(doc)
    assert summary.profiler_windows == 1 and summary.profiler_events > 0
    t = Trace(doc)
    ops = [e for e in t.on(f"node {node}", f"rank {rank} · torch.profiler") if e.get("cat") == "cpu_op"]
    assert {"aten::linear", "aten::addmm", "aten::sum"} <= {e["name"] for e in ops}
    ours = t.on(f"node {node}", f"rank {rank}")
    phase = {e["name"]: e for e in ours if e["ph"] == "X" and e["args"].get("step") == 2}
    step = phase["train_step"]
    for op in ops:  # every operator of the window ran during step 2
        assert step["ts"] <= op["ts"] and op["ts"] + op["dur"] <= step["ts"] + step["dur"], (op, step)
    # finer: the model's forward inside our forward phase, SGD's updates inside our optimizer phase
    slack = 50  # µs: torch.profiler's clock is converted to wall time on its own
    for name, where in (("aten::linear", "forward"), ("aten::add_", "optimizer")):
        p = phase[where]
        for op in (e for e in ops if e["name"] == name):
            mid = op["ts"] + op["dur"] / 2
            assert p["ts"] - slack <= mid <= p["ts"] + p["dur"] + slack, (op, p)
    flows = [e for e in t.events if e["ph"] in "sf"]
    assert flows and {e["tid"] for e in flows} <= set(t.threads)


def test_profiler_threads_are_named_like_kineto_names_them():
    from stallwatch.present.trace_export import _torch_label, _torch_names

    meta = [  # the metadata of a CUDA run's trace, as torch.profiler (kineto) writes it
        {"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": 4242, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 4242, "tid": 4300, "args": {"name": "thread 4300 (pt_autograd_0)"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
    ]
    names = _torch_names(meta)
    assert _torch_label(3, 4242, 4242, 4242, names) == "rank 3 · torch.profiler"
    assert _torch_label(3, 4242, 4242, 4300, names) == "rank 3 · torch.profiler · thread 4300 (pt_autograd_0)"
    assert _torch_label(3, 4242, 0, 7, names) == "rank 3 · torch.profiler · GPU 0 stream 7"
    assert _torch_label(3, 4242, "Spans", "PyTorch Profiler", names) == "rank 3 · torch.profiler · PyTorch Profiler"
    assert _torch_label(3, 4242, "", "", names) == "rank 3 · torch.profiler"  # global markers
    assert _torch_label(3, 4242, 1, 9, names) == "rank 3 · torch.profiler · process 1 thread 9"


def test_an_unreadable_profiler_trace_is_left_out_with_a_line(torch_run, tmp_path, caplog):
    import shutil

    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    copy = tmp_path / "run"
    shutil.copytree(torch_run, copy)
    (trace,) = copy.glob("traces/*/*/*/trace.json.gz")
    trace.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": 1,'))  # cut off mid-write
    summary = export_timeline(open_run(str(copy)), tmp_path / "out.json.gz")
    doc = _load(tmp_path / "out.json.gz")
    assert_valid_trace_event_format(doc)
    assert summary.profiler_windows == 0 and len(summary.skipped_windows) == 1 and summary.framework_events > 0
    assert doc["otherData"]["skipped_profiler_windows"] == summary.skipped_windows
    assert any("left out profiling window" in r.getMessage() for r in caplog.records)


def test_a_gzip_bomb_trace_is_refused_without_being_loaded(torch_run, tmp_path, caplog, monkeypatch):
    """A 0.5 MB trace.json.gz that expands to 1.1 GB was decompressed and parsed whole (2.2 GB of memory);
    now its size is counted while decompressing and it is left out with a line, in bounded memory. Here a
    65 KB gzip of 64 MB against a 32 MB limit, so the test stays small."""
    import shutil
    import tracemalloc

    from stallwatch.present import trace_export

    monkeypatch.setattr(trace_export, "MAX_TRACE_JSON_BYTES", 32 << 20, raising=False)
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    copy = tmp_path / "run"
    shutil.copytree(torch_run, copy)
    (trace,) = copy.glob("traces/*/*/*/trace.json.gz")
    trace.write_bytes(_whitespace_bomb(64 << 20))
    run = open_run(str(copy))
    tracemalloc.start()
    try:
        summary = export_timeline(run, tmp_path / "out.json.gz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, f"peak {peak / 2**20:.0f} MB"
    assert summary.profiler_windows == 0 and len(summary.skipped_windows) == 1 and summary.framework_events > 0
    assert_valid_trace_event_format(_load(tmp_path / "out.json.gz"))
    (line,) = [r.getMessage() for r in caplog.records if "left out profiling window" in r.getMessage()]
    assert "more than 32 MB of JSON" in line


def test_a_trace_is_streamed_not_loaded(torch_run, tmp_path, monkeypatch):
    """A big real-looking trace (its events repeated to 12 MB) is merged whole, holding one event at a time."""
    import shutil
    import tracemalloc

    copy = tmp_path / "run"
    shutil.copytree(torch_run, copy)
    (trace,) = copy.glob("traces/*/*/*/trace.json.gz")
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    doc["traceEvents"] += ops * ((12 << 20) // len(json.dumps(ops)))
    raw = json.dumps(doc).encode()
    trace.write_bytes(gzip.compress(raw, 1))
    tracemalloc.start()
    try:
        summary = export_timeline(open_run(str(copy)), tmp_path / "out.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert summary.profiler_windows == 1 and summary.profiler_events >= len(doc["traceEvents"]) - 100
    # a buffer of a megabyte or two and the output's; loaded whole it was 275 MB for 40 MB (about 7x the JSON)
    assert peak < 24 << 20, f"peak {peak / 2**20:.0f} MB for {len(raw) / 2**20:.0f} MB of JSON"


def _whitespace_bomb(json_bytes: int) -> bytes:
    """A gzip of a Chrome trace whose event list is `json_bytes` of whitespace (about 1000:1)."""
    import zlib

    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [co.compress(b'{"traceEvents": [')]
    for _ in range(json_bytes >> 20):
        parts.append(co.compress(b" " * (1 << 20)))
    return b"".join(parts + [co.compress(b"]}"), co.flush()])


# -- fuzzing: whatever a window's trace holds, the export writes valid JSON and leaves out what it cannot use ------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzz import JSON, NASTY_FLOATS, NASTY_INTS, fuzz, json_bytes  # noqa: E402

_TORCH_EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "i", "I", "C", "s", "t", "f", "M", "B"]) | JSON},
    optional={"ts": st.integers() | NASTY_INTS | NASTY_FLOATS | JSON, "dur": st.integers(-5, 10**6) | NASTY_FLOATS
              | JSON, "name": JSON, "cat": JSON, "pid": JSON, "tid": JSON, "id": JSON, "args": JSON})


@fuzz(40)
@given(events=st.lists(_TORCH_EVENT, max_size=8), base=JSON)
def test_fuzz_torch_events_in_a_window(tmp_path_factory, events, base):
    root = tmp_path_factory.mktemp("fz") / "run"
    (root / "nodes").mkdir(parents=True)
    (root / "nodes" / "n.json").write_text(json.dumps({"node": "n", "start_us": T0, "end_us": T0 + S}))
    window = root / "traces" / "n" / "0" / "detailed-0001763790000000"
    window.mkdir(parents=True)
    (window / "window.json").write_text(json.dumps({"layer": "detailed", "start_us": T0, "end_us": T0 + S,
                                                    "rank": 0, "pid": 7}))
    (window / "trace.json.gz").write_bytes(gzip.compress(json_bytes({"traceEvents": events,
                                                                     "baseTimeNanoseconds": base})))
    out = root.parent / "out.json"
    summary = export_timeline(open_run(str(root)), out)
    doc = json.loads(out.read_text())  # valid JSON, whatever went in
    assert summary.profiler_windows + len(summary.skipped_windows) == 1
    assert all(isinstance(e.get("ts"), (int, float)) for e in doc["traceEvents"])
