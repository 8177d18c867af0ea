"""The sampler's profile store: real torch.profiler / cProfile / pyinstrument output staged by the job is
stored under traces/<node>/<rank>/<window>/ with its summaries, refused when it is not what it should be,
kept within the storage cap, and never blocks or breaks the sampler."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stallwatch.collect.artifacts import QUEUE_SIZE, ArtifactStore
from stallwatch.store import layout
from stallwatch.store.chunk_writer import StorageBudget
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run
from tests.profile_outputs import (LINEAR_CALLS, MATMULS, START_US, WORK_CALLS, RealOutputs, artifact,
                                   make_real_outputs, stage)

NODE = "algo-1"
HANG_GUARD_S = 60.0


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> RealOutputs:
    return make_real_outputs(tmp_path_factory.mktemp("real-outputs"))


@pytest.fixture
def location(tmp_path) -> RunLocation:
    loc = RunLocation(str(tmp_path / "run"))
    loc.write_atomic(layout.RUN_JSON, b'{"run_id": "run"}')
    return loc


@pytest.fixture
def staging(tmp_path) -> Path:
    d = tmp_path / "staging"
    d.mkdir(mode=0o700)
    return d


def window_dir(rank: int, layer: str, start_us: int = START_US) -> Path:
    return Path(layout.trace_window_dir(NODE, rank, f"{layer}-{start_us:016d}"))


def stored_files(location: RunLocation) -> list[str]:
    return sorted(e.path for e in location.list(layout.TRACES_DIR))


def wait_until(predicate, timeout: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class SlowSink:
    """A RunLocation whose writes wait for `gate` (a slow disk or endpoint): the store must not block."""

    def __init__(self, inner: RunLocation, delay_s: float = 0.0) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.gate = threading.Event()
        self.gate.set()
        self.writes: list[str] = []

    def write_atomic(self, rel: str, data: bytes) -> None:
        self.gate.wait(HANG_GUARD_S)
        time.sleep(self.delay_s)
        self.inner.write_atomic(rel, data)
        self.writes.append(rel)

    def delete(self, rel: str) -> None:
        self.inner.delete(rel)


class FailingSink:
    """Every write after the first `ok` ones fails like a full disk."""

    def __init__(self, inner: RunLocation, ok: int) -> None:
        self.inner, self.ok = inner, ok

    def write_atomic(self, rel: str, data: bytes) -> None:
        if self.ok <= 0:
            raise OSError(28, "No space left on device")
        self.ok -= 1
        self.inner.write_atomic(rel, data)

    def delete(self, rel: str) -> None:
        self.inner.delete(rel)


# -- what is stored ----------------------------------------------------------------------------------------

def test_a_torch_profiler_window_is_stored_gzipped_with_operator_totals(real, location, staging):
    staged = stage(real.trace, staging)
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(3, artifact("detailed", {"trace.json": staged}))
    store.close(HANG_GUARD_S)

    d = location.local_path(str(window_dir(3, "detailed")))
    assert sorted(os.listdir(d)) == ["operators.parquet", "trace.json.gz", "window.json"]
    assert not os.path.exists(staged), "the staged file is deleted once stored"
    assert store.stored == 1 and store.dropped == 0

    with gzip.open(d / "trace.json.gz", "rt") as fh:  # what Perfetto and HTA open
        trace = json.load(fh)
    assert trace == json.loads(real.trace.read_text())

    ops = pq.read_table(d / "operators.parquet").to_pylist()
    by_name = {(r["operator"], r["device"]): r for r in ops}
    assert by_name[("aten::mm", "cpu")]["calls"] == MATMULS
    assert by_name[("aten::addmm", "cpu")]["calls"] == LINEAR_CALLS
    assert by_name[("aten::linear", "cpu")]["calls"] == LINEAR_CALLS
    assert {r["device"] for r in ops} == {"cpu"}  # a CPU-only trace has no kernels
    assert all(r["operator"].startswith(("aten::", "autograd::")) or "Backward" in r["operator"] for r in ops)
    for r in ops:
        assert 0 <= r["self_us"] <= r["total_us"] + 1e-6, r
    # aten::linear only wraps aten::t and aten::addmm: most of its time is its children's
    linear = by_name[("aten::linear", "cpu")]
    assert linear["self_us"] < linear["total_us"]
    # the same numbers torch's own key_averages() gives for these operators
    assert set(real.torch_totals) == {"aten::mm", "aten::addmm", "aten::linear"}
    for name, (count, self_us, total_us) in real.torch_totals.items():
        row = by_name[(name, "cpu")]
        assert row["calls"] == count
        assert row["self_us"] == pytest.approx(self_us, rel=1e-3, abs=0.01)
        assert row["total_us"] == pytest.approx(total_us, rel=1e-3, abs=0.01)

    record = json.loads((d / "window.json").read_text())
    assert record["node"] == NODE and record["rank"] == 3 and record["window"] == f"detailed-{START_US:016d}"
    assert record["files"] == ["trace.json.gz", "operators.parquet"] and record["summary_error"] is None
    assert record["profiler"] == "torch.profiler" and record["start_us"] == START_US


def test_a_cprofile_window_keeps_the_dump_and_counts_calls(real, location, staging):
    staged = stage(real.pstats, staging)
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(0, artifact("python", {"profile.pstats": staged}))
    store.close(HANG_GUARD_S)

    d = location.local_path(str(window_dir(0, "python")))
    assert sorted(os.listdir(d)) == ["functions.parquet", "profile.pstats", "window.json"]
    assert (d / "profile.pstats").read_bytes() == real.pstats.read_bytes()
    import pstats

    assert pstats.Stats(str(d / "profile.pstats")).total_calls > 0  # still a pstats file

    rows = pq.read_table(d / "functions.parquet").to_pylist()
    work = [r for r in rows if r["function"] == "busy_work"]
    assert len(work) == 1
    assert work[0]["calls"] == WORK_CALLS
    assert work[0]["file"].endswith("profile_outputs.py") and work[0]["line"] > 0
    assert 0 < work[0]["self_us"] <= work[0]["total_us"]
    assert all(r["self_us"] <= r["total_us"] + 1e-6 for r in rows)
    assert json.loads((d / "window.json").read_text())["profiler"] == "cprofile"


def test_a_pyinstrument_window_gets_html_and_function_totals(real, location, staging):
    staged = stage(real.pyinstrument, staging)
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(1, artifact("python", {"pyinstrument.json": staged}))
    store.close(HANG_GUARD_S)

    d = location.local_path(str(window_dir(1, "python")))
    assert sorted(os.listdir(d)) == ["functions.parquet", "pyinstrument.html", "pyinstrument.json", "window.json"]
    assert (d / "pyinstrument.json").read_bytes() == real.pyinstrument.read_bytes()
    html = (d / "pyinstrument.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "pyinstrument" in html.lower()
    from pyinstrument.session import Session

    assert Session.load(str(d / "pyinstrument.json")).root_frame() is not None

    rows = pq.read_table(d / "functions.parquet").to_pylist()
    names = {r["function"] for r in rows}
    assert {"busy_work", "recurse"} <= names
    root_us = real.pyinstrument_root_s * 1e6
    # every sample is some function's self time, exactly once
    assert sum(r["self_us"] for r in rows) == pytest.approx(root_us, rel=1e-6)
    for r in rows:
        assert 0 <= r["self_us"] <= r["total_us"] + 1e-6 <= root_us + 1e-3, r
        assert r["calls"] >= 1
    recurse = next(r for r in rows if r["function"] == "recurse")
    assert recurse["self_us"] < recurse["total_us"]  # its time is busy_work's
    assert recurse["calls"] >= 4  # four nested frames per call tree (depth 3 .. 0)


def test_an_already_gzipped_trace_is_stored_as_it_came(real, location, staging):
    """torch writes a gzipped trace when the file name ends in .gz; it is not compressed twice."""
    gz = staging / "trace-gz.json"
    gz.write_bytes(gzip.compress(real.trace.read_bytes()))
    original = gz.read_bytes()
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(0, artifact("detailed", {"trace.json": str(gz)}))
    store.close(HANG_GUARD_S)
    d = location.local_path(str(window_dir(0, "detailed")))
    assert (d / "trace.json.gz").read_bytes() == original
    assert pq.read_table(d / "operators.parquet").num_rows > 0


def test_a_trace_that_cannot_be_summarized_is_still_stored(location, staging, stallwatch_log):
    bad = staging / "cut.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm"')  # cut off
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(0, artifact("detailed", {"trace.json": str(bad)}))
    store.close(HANG_GUARD_S)
    d = location.local_path(str(window_dir(0, "detailed")))
    assert sorted(os.listdir(d)) == ["trace.json.gz", "window.json"]
    record = json.loads((d / "window.json").read_text())
    assert record["files"] == ["trace.json.gz"] and "the trace is cut off" in record["summary_error"]
    assert len([line for line in stallwatch_log.lines() if "operators.parquet" in line]) == 1


def test_the_run_reads_its_windows_back(real, location, staging):
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(0, artifact("detailed", {"trace.json": stage(real.trace, staging)}))
    store.submit(0, artifact("python", {"profile.pstats": stage(real.pstats, staging)}, start_us=START_US + 10))
    store.close(HANG_GUARD_S)
    run = open_run(location.uri)
    assert [p["layer"] for p in run.profiles()] == ["detailed", "python"]
    ops = run.operators()
    assert set(ops["window"].to_pylist()) == {f"detailed-{START_US:016d}"}
    assert set(ops["rank"].to_pylist()) == {0} and set(ops["node"].to_pylist()) == {NODE}
    assert "busy_work" in run.functions()["function"].to_pylist()


# -- what is refused ---------------------------------------------------------------------------------------

def test_files_outside_the_staging_directory_are_refused_and_left_alone(real, location, staging, tmp_path,
                                                                         stallwatch_log):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = stage(real.trace, elsewhere, "precious.json")
    link = staging / "link.json"
    link.symlink_to(outside)  # inside by name, outside in fact
    inner_dir = staging / "sub"
    inner_dir.mkdir()
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(0, artifact("detailed", {"trace.json": outside}))
    store.submit(0, artifact("detailed", {"trace.json": str(link)}))
    store.submit(0, artifact("detailed", {"trace.json": str(staging / ".." / "elsewhere" / "precious.json")}))
    store.submit(0, artifact("detailed", {"trace.json": str(inner_dir)}))  # not a regular file
    store.submit(0, artifact("detailed", {"trace.json": "relative/trace.json"}))
    store.submit(0, artifact("detailed", {"trace.json": str(staging / "nul\x00byte.json")}))
    store.close(HANG_GUARD_S)
    assert stored_files(location) == []
    assert os.path.exists(outside) and link.is_symlink(), "nothing outside the staging dir is touched"
    assert store.dropped == 6 and store.stored == 0
    refusals = [line for line in stallwatch_log.lines() if "refusing a profiling window" in line]
    assert any("outside the staging directory" in line for line in refusals)
    assert any("not a regular file" in line for line in refusals)
    assert len(refusals) == 3  # outside (said once for the three), not a regular file, not a usable path


@pytest.mark.parametrize("window", ["../escape", "a/b", ".hidden", "", "x" * 129, "dé", None, 17])
def test_bad_window_names_are_refused_and_the_staged_files_removed(real, location, staging, window,
                                                                   stallwatch_log):
    staged = stage(real.pstats, staging)
    message = artifact("python", {"profile.pstats": staged})
    message["window"] = window
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(0, message)
    store.close(HANG_GUARD_S)
    assert stored_files(location) == [] and not os.path.exists(staged)
    assert len([line for line in stallwatch_log.lines() if "bad window name" in line]) == 1


def test_unknown_layers_and_file_names_are_refused(real, location, staging, stallwatch_log):
    store = ArtifactStore(location, NODE, str(staging))
    bad_layer = artifact("python", {"profile.pstats": stage(real.pstats, staging)})
    bad_layer["layer"] = "nvtx"  # ("memory" is a layer since issue 38)
    store.submit(0, bad_layer)
    store.submit(0, artifact("python", {"../../run.json": stage(real.pstats, staging)}))
    store.submit(0, artifact("detailed", {"profile.pstats": stage(real.pstats, staging)}))
    store.submit(-1, artifact("python", {"profile.pstats": stage(real.pstats, staging)}))
    store.submit(0, "not even a dict")  # type: ignore[arg-type]
    store.close(HANG_GUARD_S)
    assert stored_files(location) == [] and list(staging.iterdir()) == []
    lines = stallwatch_log.lines()
    assert any("unknown layer 'nvtx'" in line for line in lines)
    assert any("unexpected file name" in line for line in lines)
    assert any("bad rank -1" in line for line in lines)


# -- storage cap -------------------------------------------------------------------------------------------

def test_a_window_over_the_storage_cap_is_not_stored_at_all(real, location, staging, stallwatch_log):
    budget = StorageBudget(limit=10_000, used=9_000)  # the trace alone is larger than what is left
    store = ArtifactStore(location, NODE, str(staging), budget)
    store.submit(0, artifact("detailed", {"trace.json": stage(real.trace, staging)}))
    store.submit(1, artifact("detailed", {"trace.json": stage(real.trace, staging)}))
    store.close(HANG_GUARD_S)
    assert stored_files(location) == [] and list(staging.iterdir()) == []
    assert budget.used == 9_000 and store.dropped == 2
    assert len([line for line in stallwatch_log.lines() if "storage cap" in line]) == 1


def test_stored_windows_count_against_the_shared_budget(real, location, staging):
    budget = StorageBudget(limit=1 << 30, used=123)
    store = ArtifactStore(location, NODE, str(staging), budget)
    store.submit(0, artifact("detailed", {"trace.json": stage(real.trace, staging)}))
    store.submit(0, artifact("python", {"pyinstrument.json": stage(real.pyinstrument, staging)}))
    store.close(HANG_GUARD_S)
    on_disk = sum(e.size for e in location.list(layout.TRACES_DIR))
    assert on_disk > 0 and budget.used == 123 + on_disk


# -- never blocking, never breaking ------------------------------------------------------------------------

def test_submit_does_not_wait_for_a_slow_sink_and_a_full_queue_drops(real, location, staging, stallwatch_log):
    sink = SlowSink(location)
    sink.gate.clear()  # the sink hangs until released
    store = ArtifactStore(sink, NODE, str(staging))
    staged = [stage(real.pstats, staging) for _ in range(QUEUE_SIZE + 4)]
    t0 = time.monotonic()
    store.submit(0, artifact("python", {"profile.pstats": staged[0]}, start_us=START_US))
    wait_until(lambda: store._busy is not None)  # the thread holds the first one, waiting on the sink
    for i, path in enumerate(staged[1:], start=1):
        store.submit(0, artifact("python", {"profile.pstats": path}, start_us=START_US + i))
    assert time.monotonic() - t0 < 5.0
    dropped = staged[QUEUE_SIZE + 1:]
    assert all(not os.path.exists(p) for p in dropped), "dropped windows' staged files are deleted"
    assert len([line for line in stallwatch_log.lines() if "already waiting" in line]) == 1
    sink.gate.set()
    store.close(HANG_GUARD_S)
    assert store.stored == QUEUE_SIZE + 1 and store.dropped == 3
    assert len(open_run(location.uri).profiles()) == QUEUE_SIZE + 1
    assert list(staging.iterdir()) == []


def test_close_finishes_queued_windows(real, location, staging):
    sink = SlowSink(location, delay_s=0.02)
    store = ArtifactStore(sink, NODE, str(staging))
    for i in range(5):
        store.submit(i, artifact("python", {"profile.pstats": stage(real.pstats, staging)}))
    store.close(HANG_GUARD_S)  # returns once all five are stored
    assert store.stored == 5
    assert [p["rank"] for p in open_run(location.uri).profiles()] == [0, 1, 2, 3, 4]
    assert list(staging.iterdir()) == []


def test_close_gives_up_on_time_and_says_so_in_one_line(real, location, staging, stallwatch_log):
    sink = SlowSink(location)
    sink.gate.clear()
    store = ArtifactStore(sink, NODE, str(staging))
    for i in range(6):
        store.submit(i, artifact("python", {"profile.pstats": stage(real.pstats, staging)}))
    wait_until(lambda: store._busy is not None)
    t0 = time.monotonic()
    store.close(0.3)
    assert time.monotonic() - t0 < 5.0
    said = [line for line in stallwatch_log.lines() if "could not be stored" in line]
    assert len(said) == 1 and said[0].startswith("6 profiling window(s)")
    sink.gate.set()  # the one in progress gives up at its next step
    wait_until(lambda: not store._thread.is_alive())
    assert list(staging.iterdir()) == [] and store.stored == 0
    assert open_run(location.uri).profiles() == []
    store.submit(0, artifact("python", {"profile.pstats": stage(real.pstats, staging)}))  # after close: dropped
    assert list(staging.iterdir()) == []


def test_a_failing_sink_leaves_no_half_window_and_the_next_one_is_stored(real, location, staging,
                                                                         stallwatch_log):
    sink = FailingSink(location, ok=1)  # trace.json.gz is written, operators.parquet fails
    store = ArtifactStore(sink, NODE, str(staging))
    store.submit(0, artifact("detailed", {"trace.json": stage(real.trace, staging)}))
    wait_until(lambda: store.dropped == 1)
    assert stored_files(location) == [], "the written part of the window is removed again"
    sink.ok = 10
    store.submit(0, artifact("python", {"profile.pstats": stage(real.pstats, staging)}))
    store.close(HANG_GUARD_S)
    assert [p["layer"] for p in open_run(location.uri).profiles()] == ["python"]
    said = [line for line in stallwatch_log.lines() if "failed" in line]
    assert len(said) == 1 and "No space left on device" in said[0]


def test_without_pyinstrument_in_the_sampler_the_session_is_kept_as_json(real, location, staging, monkeypatch,
                                                                         stallwatch_log):
    import sys

    monkeypatch.setitem(sys.modules, "pyinstrument.renderers", None)  # import fails as if not installed
    store = ArtifactStore(location, NODE, str(staging))
    for rank in (0, 1):
        store.submit(rank, artifact("python", {"pyinstrument.json": stage(real.pyinstrument, staging)}))
    store.close(HANG_GUARD_S)
    d = location.local_path(str(window_dir(0, "python")))
    assert sorted(os.listdir(d)) == ["pyinstrument.json", "window.json"]
    assert "pyinstrument" in json.loads((d / "window.json").read_text())["summary_error"]
    assert len([line for line in stallwatch_log.lines() if "JSON only" in line]) == 1


def test_a_huge_trace_is_stored_without_a_summary(real, location, staging, monkeypatch, stallwatch_log):
    from stallwatch.collect import artifacts

    monkeypatch.setattr(artifacts, "MAX_SUMMARY_BYTES", 1000)  # the real trace is tens of kB
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(0, artifact("detailed", {"trace.json": stage(real.trace, staging)}))
    store.close(HANG_GUARD_S)
    d = location.local_path(str(window_dir(0, "detailed")))
    assert sorted(os.listdir(d)) == ["trace.json.gz", "window.json"]
    assert "larger than" in json.loads((d / "window.json").read_text())["summary_error"]
    assert len([line for line in stallwatch_log.lines() if "without operators.parquet" in line]) == 1


def _big_trace(real: RealOutputs, staging: Path, megabytes: int) -> tuple[Path, int]:
    """The real trace with its operators repeated (shifted in time) to about `megabytes` of JSON."""
    doc = json.loads(real.trace.read_text())
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    span = max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops) + 1
    copies = (megabytes << 20) // len(json.dumps(ops))
    for k in range(1, copies + 1):
        doc["traceEvents"] += [{**e, "ts": e["ts"] + k * span} for e in ops]
    path = staging / "big.json"
    path.write_text(json.dumps(doc))
    return path, copies + 1


def test_a_big_trace_is_summarized_in_bounded_memory(real, location, staging):
    """The summary parsed the whole trace (json.load): a 400 MB trace took the sampler to 2.6 GB. Streamed,
    it holds 24 bytes per operator; the totals are the original's times the copies."""
    import tracemalloc

    path, copies = _big_trace(real, staging, 40)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        store = ArtifactStore(location, NODE, str(staging))
        store.submit(0, artifact("detailed", {"trace.json": str(path)}))
        store.close(HANG_GUARD_S)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 2, f"peak {peak / 2**20:.0f} MB for a {size / 2**20:.0f} MB trace"
    d = location.local_path(str(window_dir(0, "detailed")))
    ops = {(r["operator"], r["device"]): r for r in pq.read_table(d / "operators.parquet").to_pylist()}
    assert ops[("aten::linear", "cpu")]["calls"] == LINEAR_CALLS * copies


def test_a_trace_past_the_byte_cap_is_not_stored_and_the_window_says_why(real, location, staging, monkeypatch,
                                                                         stallwatch_log):
    from stallwatch.collect import artifacts

    monkeypatch.setattr(artifacts, "MAX_TRACE_BYTES", 4 << 20, raising=False)
    path, _ = _big_trace(real, staging, 8)
    store = ArtifactStore(location, NODE, str(staging))
    store.submit(0, artifact("detailed", {"trace.json": str(path)}))
    store.close(HANG_GUARD_S)
    d = location.local_path(str(window_dir(0, "detailed")))
    assert sorted(os.listdir(d)) == ["window.json"]
    record = json.loads((d / "window.json").read_text())
    assert record["files"] == [] and "more than 4 MB of JSON and was not stored" in record["summary_error"]
    assert len([line for line in stallwatch_log.lines() if "was not stored" in line]) == 1
    assert not path.exists()  # the staged file is gone all the same
