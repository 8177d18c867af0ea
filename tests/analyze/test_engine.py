"""The Dask engine gives what the local engine gives, on a real LocalCluster of two worker processes that read the
run from its path: rule results over many slices (node by node), per-node step statistics and the job summary, the timeline
file byte for byte. A scheduler that cannot be reached is one line on stderr."""

from __future__ import annotations

import gzip
import json
import logging

import pytest

from stallwatch.analyze import engine as engine_mod
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.engine import EngineError, LocalEngine, open_engine, parse_engine
from stallwatch.analyze.judge.by_node import evaluate_run
from stallwatch.analyze.judge.feed import iter_run
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.cli import main
from stallwatch.present.trace_export import export_timeline
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import spy_replays
from tests.present.generated_run import training_run

pytest.importorskip("distributed")

SLOW = {k: 2_000_000 for k in range(300, 1500, 100)}
SLICE_US = 120 * 1_000_000  # the 10-minute run in 5 slices per node: several tasks, handed back in order


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    # two nodes of two ranks; planted: 12 slow training steps (300, 400, … 1400) on every rank
    return training_run(tmp_path_factory.mktemp("engine") / "run", nodes=("algo-1", "algo-2"), ranks=2,
                        slow=SLOW)


@pytest.fixture(scope="module")
def dask_engine():
    with open_engine("dask", workers=2) as engine:
        yield engine


def _rules(run_dir, engine):
    run = open_run(str(run_dir))
    return [r.to_json() for r in evaluate(builtin_rules(), iter_run(run, builtin_rules(), slice_us=SLICE_US,
                                                                      engine=engine))]


def test_rules_on_dask_equal_the_local_engine(run_dir, dask_engine):
    local = _rules(run_dir, LocalEngine())
    tasks = dask_engine.stats.tasks
    remote = _rules(run_dir, dask_engine)
    assert json.dumps(remote, sort_keys=True, default=str) == json.dumps(local, sort_keys=True, default=str)
    assert dask_engine.stats.tasks - tasks == 2 * 5  # one task per node and slice
    outliers = next(r for r in local if r["RuleName"] == "StepOutlier")
    assert outliers["RuleTriggered"] == 4  # the planted slow steps, seen across slices, on every rank
    assert outliers["Details"]["step_details"]["algo-2/1/TRAIN"]["step_numbers"] == sorted(SLOW)


def test_rules_fed_node_by_node_on_dask_equal_the_local_engine(run_dir, dask_engine):
    """The rules that merge run on the workers, one task per node, and are merged here (rules/by_node.py)."""
    local = _rules(run_dir, LocalEngine())
    tasks, sent = dask_engine.stats.tasks, dask_engine.stats.result_bytes
    remote = [r.to_json() for r in evaluate_run(open_run(str(run_dir)), builtin_rules(), engine=dask_engine,
                                                  slice_us=SLICE_US)]
    assert json.dumps(remote, sort_keys=True, default=str) == json.dumps(local, sort_keys=True, default=str)
    assert dask_engine.stats.tasks - tasks == 2  # one task per node
    assert dask_engine.stats.result_bytes - sent < 2 * 5 * 100_000  # the rules' summaries, not the slices


def test_straggler_merged_past_its_budget_reads_the_run_again_in_the_caller(run_dir, dask_engine, monkeypatch):
    """The workers keep their node's steps (their budget is the default); the caller's, set to nothing here, is
    passed when it merges them, so it lets them go and reads the run again for its result: still the local JSON."""
    from stallwatch.analyze.rules import straggler
    from stallwatch.analyze.rules.straggler import Straggler

    local = _rules(run_dir, LocalEngine())
    monkeypatch.setattr(straggler, "KEEP_BYTES", 0)
    replays = spy_replays(monkeypatch)
    remote = evaluate_run(open_run(str(run_dir)), [Straggler], engine=dask_engine, slice_us=SLICE_US)
    assert replays, "the merged Straggler did not read the run again"
    assert json.dumps(remote[0].to_json(), sort_keys=True, default=str) == \
        json.dumps(next(r for r in local if r["RuleName"] == "Straggler"), sort_keys=True, default=str)


def test_step_statistics_and_summary_on_dask_equal_the_local_engine(run_dir, dask_engine):
    local, remote = RunAnalysis(str(run_dir)), RunAnalysis(str(run_dir), engine=dask_engine)
    assert remote.step_stats() == local.step_stats() and len(local.step_stats()) == 2 * 2 * 2  # nodes, ranks, modes
    assert remote.summary == local.summary
    assert remote.loop_spans == local.loop_spans
    remote.close()  # the engine was passed in: it stays open for the caller
    assert dask_engine.client.status == "running"


def test_report_step_views_on_dask_equal_the_local_engine(run_dir, dask_engine):
    """The report's per-step views, one task per node: histograms, rank × step matrices, training stretches."""
    import numpy as np

    local, remote = RunAnalysis(str(run_dir)), RunAnalysis(str(run_dir), engine=dask_engine)
    tasks = dask_engine.stats.tasks
    assert remote.phase_spans == local.phase_spans and len(local.phase_spans) >= 3
    a, b = remote.rank_steps(), local.rank_steps()
    assert a.ranks == b.ranks and np.array_equal(a.step_ms, b.step_ms, equal_nan=True)
    assert np.array_equal(a.wait_pct, b.wait_pct, equal_nan=True)
    for x, y in zip(remote.step_histograms({"TRAIN"}), local.step_histograms({"TRAIN"}), strict=True):
        assert x.node == y.node and np.array_equal(x.edges, y.edges)
        assert all(np.array_equal(x.shares[k], y.shares[k]) for k in y.shares)
    assert dask_engine.stats.tasks - tasks >= 3 * 2  # three passes, one task per node each (plus the step counts)


def test_timeline_on_dask_is_the_local_file(run_dir, dask_engine, tmp_path):
    run = open_run(str(run_dir))
    a = export_timeline(run, tmp_path / "local.json.gz")
    b = export_timeline(run, tmp_path / "dask.json.gz", engine=dask_engine)
    assert a.framework_events > 0 and a.counter_series > 0 and b.framework_events == a.framework_events
    assert gzip.decompress((tmp_path / "dask.json.gz").read_bytes()) == \
        gzip.decompress((tmp_path / "local.json.gz").read_bytes())


def test_engine_names():
    assert parse_engine(None) == ("local", None)
    assert parse_engine("dask") == ("dask", None)
    assert parse_engine("dask=tcp://10.0.0.5:8786") == ("dask", "tcp://10.0.0.5:8786")
    for bad in ("spark", "dask=", "local=x"):
        with pytest.raises(EngineError):
            parse_engine(bad)


def test_an_unreachable_scheduler_is_one_line(run_dir, capsys, monkeypatch):
    monkeypatch.setattr(engine_mod, "CONNECT_TIMEOUT_S", 1)
    # the command line's log handler would outlive this test (bound to capsys's stream): keep logging as it was
    monkeypatch.setattr(logging.getLogger("stallwatch"), "handlers", [logging.NullHandler()])
    monkeypatch.setattr(logging.getLogger("stallwatch"), "propagate", logging.getLogger("stallwatch").propagate)
    monkeypatch.setattr(logging.getLogger("stallwatch"), "level", logging.getLogger("stallwatch").level)
    assert main(["rules", str(run_dir), "--engine", "dask=tcp://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stallwatch rules: cannot reach the Dask scheduler at tcp://127.0.0.1:9")
    assert "\n" not in err and "Traceback" not in err


def test_the_rules_command_on_dask_writes_the_local_engines_files(run_dir, dask_engine, tmp_path, monkeypatch):
    """`stallwatch rules RUN --engine dask=ADDRESS`, the user's way in: the same rules/*.json as without it."""
    import shutil

    monkeypatch.setattr(logging.getLogger("stallwatch"), "handlers", [logging.NullHandler()])
    monkeypatch.setattr(logging.getLogger("stallwatch"), "propagate", logging.getLogger("stallwatch").propagate)
    monkeypatch.setattr(logging.getLogger("stallwatch"), "level", logging.getLogger("stallwatch").level)
    local, remote = tmp_path / "local", tmp_path / "remote"
    shutil.copytree(run_dir, local)
    shutil.copytree(run_dir, remote)
    address = dask_engine.client.scheduler.address
    assert main(["rules", str(local)]) == 0
    assert main(["rules", str(remote), "--engine", f"dask={address}"]) == 0
    written = sorted(p.name for p in (local / "rules").glob("*.json"))
    assert len(written) == len(builtin_rules())
    assert all((remote / "rules" / name).read_bytes() == (local / "rules" / name).read_bytes() for name in written)


@pytest.fixture
def lone_worker_cluster(tmp_path):
    """A real scheduler and one worker, each its own process (no nanny to bring a killed worker back)."""
    import os
    import subprocess
    import sys
    import time

    info = tmp_path / "scheduler.json"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
                                  "--no-dashboard", "--scheduler-file", str(info)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(info),
                               "--no-nanny", "--nthreads", "1", "--no-dashboard"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        address = None
        while time.monotonic() < deadline:
            try:
                address = json.loads(info.read_text())["address"]
                from distributed import Client

                with Client(address, timeout=5) as client:
                    if client.scheduler_info().get("workers"):
                        break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        yield address, scheduler, worker
    finally:
        for proc in (worker, scheduler):
            proc.kill()
            proc.wait(10)


def _quiet_logging(monkeypatch):
    monkeypatch.setattr(logging.getLogger("stallwatch"), "handlers", [logging.NullHandler()])
    monkeypatch.setattr(logging.getLogger("stallwatch"), "propagate", logging.getLogger("stallwatch").propagate)
    monkeypatch.setattr(logging.getLogger("stallwatch"), "level", logging.getLogger("stallwatch").level)


def test_a_cluster_whose_only_worker_died_is_one_line_not_a_hang(run_dir, lone_worker_cluster, capsys, monkeypatch):
    """The cluster's only worker is killed: `stallwatch rules --engine dask=ADDRESS` says so in one line once the
    cluster has had no worker for a while (shortened here), exit 2. It hung with no output (killed at 606 s)."""
    address, _, worker = lone_worker_cluster
    monkeypatch.setattr(engine_mod, "NO_WORKER_S", 3.0)
    _quiet_logging(monkeypatch)
    worker.kill()
    worker.wait(10)
    assert main(["rules", str(run_dir), "--engine", f"dask={address}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"stallwatch rules: the Dask scheduler at {address} has had no worker for"), err
    assert "Traceback" not in capsys.readouterr().err


def test_a_scheduler_that_dies_mid_evaluation_is_one_line_not_a_traceback(run_dir, lone_worker_cluster, capsys,
                                                                          monkeypatch):
    """The scheduler is killed while the command waits on its tasks: one line, exit 2 (it was a
    FuturesCancelledError traceback)."""
    import threading

    address, scheduler, worker = lone_worker_cluster
    monkeypatch.setattr(engine_mod, "LOST_SCHEDULER_S", 3.0)
    _quiet_logging(monkeypatch)
    worker.kill()  # the tasks wait, so the scheduler surely dies while the command is in them
    worker.wait(10)
    threading.Timer(3.0, scheduler.kill).start()
    assert main(["rules", str(run_dir), "--engine", f"dask={address}"]) == 2
    out = capsys.readouterr().err
    assert out.strip().splitlines()[-1].startswith(f"stallwatch rules: lost the Dask scheduler at {address}"), out
    assert "Traceback" not in out
