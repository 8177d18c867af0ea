"""Runs on S3, against a real S3-protocol server on loopback (moto's server mode), and against endpoints
that are down or never answer. Every subprocess has a timeout; time limits here are hang guards only."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

import stallwatch
from stallwatch.store import layout
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import RunNotFoundError
from tests.store.s3_server import BlackHole, S3Server, SlowProxy, closed_port, s3_environment, spool_files

SUBPROCESS_TIMEOUT_S = 120
HANG_GUARD_S = 60.0


def spool_dir(cache: Path, run_uri: str, node: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_uri.split("://", 1)[-1])
    return cache / "stallwatch" / "spool" / safe / node


# -- RunLocation --------------------------------------------------------------------------------------------

def test_run_location_round_trip_on_s3(s3_server: S3Server, s3_env, bucket):
    loc = RunLocation(f"s3://{bucket}/prefix/run-1/")
    assert loc.remote and loc.root == f"{bucket}/prefix/run-1"
    assert loc.list("") == [] and not loc.exists("run.json")

    loc.write_atomic("run.json", b'{"run_id": "run-1"}')
    loc.write_atomic("system/algo-1/part-1.parquet", b"p" * 1000)
    loc.write_atomic("system/algo-1/.hidden", b"h")
    assert loc.read("run.json") == b'{"run_id": "run-1"}'
    assert loc.exists("run.json") and loc.exists("system/algo-1/part-1.parquet")
    assert not loc.exists("system/algo-1/part-2.parquet")
    # where it landed, seen by an independent client
    assert s3_server.keys(bucket) == sorted(["prefix/run-1/run.json", "prefix/run-1/system/algo-1/.hidden",
                                             "prefix/run-1/system/algo-1/part-1.parquet"])
    listed = {(e.path, e.size) for e in loc.list("")}
    assert listed == {("run.json", 19), ("system/algo-1/part-1.parquet", 1000)}  # hidden files left out
    assert [e.path for e in loc.list("system", recursive=True)] == ["system/algo-1/part-1.parquet"]
    assert loc.list("nothing-here") == []

    assert loc.create_exclusive("nodes/algo-1.json", b"first") is True
    assert loc.create_exclusive("nodes/algo-1.json", b"second") is False
    assert loc.read("nodes/algo-1.json") == b"first"

    loc.write_atomic("run.json", b"{}")  # overwrite
    assert loc.read("run.json") == b"{}"
    loc.delete("system/algo-1/part-1.parquet")
    loc.delete("system/algo-1/never-was.parquet")  # deleting what is not there is fine
    assert not loc.exists("system/algo-1/part-1.parquet")
    assert {e.path for e in loc.list("")} == {"run.json", "nodes/algo-1.json"}
    with pytest.raises(FileNotFoundError):
        loc.read("system/algo-1/part-1.parquet")


def test_run_location_does_not_touch_the_network_when_created(monkeypatch, tmp_path):
    """No region lookup at construction when a region is configured: a run must start even when S3 (or
    the whole network) cannot be reached. pyarrow's FileSystem.from_uri asks AWS and raises here."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    loc = RunLocation("s3://stallwatch-test-no-such-bucket-7f3a/a/b")
    assert loc.root == "stallwatch-test-no-such-bucket-7f3a/a/b" and loc.fs.region == "eu-west-1"

    for k, v in s3_environment(f"http://127.0.0.1:{closed_port()}", tmp_path).items():
        monkeypatch.setenv(k, v)
    loc = RunLocation("s3://some-bucket/a/b?region=ap-south-1")  # a region in the URI wins
    assert loc.root == "some-bucket/a/b" and loc.fs.region == "ap-south-1"
    with pytest.raises(OSError):
        loc.read("run.json")  # the endpoint is down: calls fail (quickly), construction did not


# -- stallwatch run --out s3://… ----------------------------------------------------------------------------

def test_run_to_s3_end_to_end(run_stallwatch, s3_server: S3Server, s3_env, bucket):
    uri = f"s3://{bucket}/runs/r1"
    job = "import time; time.sleep(2.5); print('job done'); raise SystemExit(3)"
    proc = run_stallwatch("run", "--interval", "200ms", "--flush-interval", "1", "--node", "e2e", "--out", uri,
                          "--", sys.executable, "-c", job, env=s3_env, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "job done\n"

    run = stallwatch.open_run(uri)
    info = run.info
    assert info["run_id"] == "r1" and info["created_by_node"] == "e2e"
    node = info["nodes"]["e2e"]
    assert node["status"] == "finished" and node["exit_code"] == 3, node
    assert node["samples_dropped"] == 0

    table = run.system(nodes=["e2e"])
    stamps = sorted(set(table.column("timestamp_us").to_pylist()))
    assert len(stamps) == node["samples_written"] >= 5, (len(stamps), node)
    gap_ms = statistics.median(b - a for a, b in zip(stamps, stamps[1:])) / 1000
    assert 100 <= gap_ms <= 400, f"median gap {gap_ms:.0f} ms at a 200 ms interval"
    metrics = set(table.column("metric").to_pylist())
    assert {"cpu_util", "mem_util"} <= metrics, metrics
    cpu = [v for d, m, v in zip(table.column("device").to_pylist(), table.column("metric").to_pylist(),
                                table.column("value").to_pylist()) if d == "cpu" and m == "cpu_util"]
    assert len(cpu) == len(stamps) and all(v is None or 0 <= v <= 100 for v in cpu)

    # Parts were compacted into a segment and deleted, in order, on the remote store too.
    keys = s3_server.keys(bucket, "runs/r1/")
    assert {"runs/r1/run.json", "runs/r1/config.json", "runs/r1/nodes/e2e.json"} <= set(keys)
    data = [k for k in keys if k.startswith("runs/r1/system/")]
    assert data and all(k.rsplit("/", 1)[-1].startswith("seg-") for k in data), keys

    shown = run_stallwatch("info", uri, env=s3_env, timeout=SUBPROCESS_TIMEOUT_S)
    assert shown.returncode == 0, shown.stderr
    assert "e2e" in shown.stdout and "cpu_util" in shown.stdout and "finished" in shown.stdout

    cache = Path(s3_env["XDG_CACHE_HOME"])
    assert spool_files(cache) == []
    assert not spool_dir(cache, uri, "e2e").parent.exists()  # the run's spool folder is gone, not just emptied


def test_rules_are_evaluated_while_an_s3_run_goes_on(s3_server: S3Server, s3_env, bucket, tmp_path):
    """`stallwatch run --out s3://…` follows its own run: rule results reach the bucket while the job still
    runs (every --rules-interval), and the report after it."""
    from tests.collect._support import Background, wait_until

    uri = f"s3://{bucket}/runs/live"
    job = Background(tmp_path, "run", "--interval", "200ms", "--flush-interval", "1", "--rules-interval", "1",
                     "--node", "n", "--out", uri, "--", sys.executable, "-c",
                     "import pathlib, time; time.sleep(12); pathlib.Path('job-ended').touch()", env=s3_env)
    ended = tmp_path / "job-ended"  # the job's cwd is tmp_path
    try:
        result = "runs/live/rules/OverallSystemUsage.json"
        wait_until(lambda: result in s3_server.keys(bucket, "runs/live/rules/") or ended.exists(), 60, period=0.2,
                   what="a rule result on S3, or the job's end")
        assert not ended.exists(), "no rule result reached the bucket while the job ran"
        assert job.wait(SUBPROCESS_TIMEOUT_S) == 0, job.stderr
    finally:
        job.proc.kill()
    keys = set(s3_server.keys(bucket, "runs/live/"))
    assert {f"runs/live/rules/{name}.json" for name in ("CPUBottleneck", "StepOutlier", "OverallSystemUsage")} <= keys
    assert "runs/live/report.html" in keys
    record = json.loads(RunLocation(uri).read("rules/OverallSystemUsage.json"))
    assert record["Status"] == "ok" and record["Datapoints"] >= 30  # the final evaluation: the whole 12 s


def test_two_nodes_make_one_run_on_s3_and_a_requeued_node_is_its_next_attempt(run_stallwatch, s3_env, bucket, tmp_path):
    uri = f"s3://{bucket}/runs/r2"
    for node in ("algo-1", "algo-2"):
        proc = run_stallwatch("run", "--interval", "200ms", "--flush-interval", "1", "--node", node, "--out", uri,
                              "--", sys.executable, "-c", "import time; time.sleep(0.8)",
                              env=s3_env, timeout=SUBPROCESS_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr

    run = stallwatch.open_run(uri)
    assert run.nodes == ["algo-1", "algo-2"]
    info = run.info
    assert set(info["nodes"]) == {"algo-1", "algo-2"}
    assert info["created_by_node"] == "algo-1", "the second node rewrote run.json"
    assert {n["status"] for n in info["nodes"].values()} == {"finished"}
    assert set(run.system().column("node").to_pylist()) == {"algo-1", "algo-2"}
    before = RunLocation(uri).read("nodes/algo-1.json")

    marker = tmp_path / "job-ran"
    proc = run_stallwatch("run", "--node", "algo-1", "--out", uri, "--", sys.executable, "-c",
                          f"open({str(marker)!r}, 'w').close()", env=s3_env, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr  # a requeue: it exited 2 without running its job
    assert marker.exists(), "the requeued job did not run"
    assert "resumed as attempt 2" in proc.stderr, proc.stderr
    record = json.loads(RunLocation(uri).read("nodes/algo-1.json"))
    assert record["attempt"] == 2 and record["attempts"][0]["end_us"] == json.loads(before)["end_us"], record
    assert stallwatch.open_run(uri).nodes == ["algo-1", "algo-2"]


def test_claims_are_atomic_on_s3(s3_env, bucket):
    """Eight threads claim one node name at once with conditional writes: exactly one wins, and its bytes stay."""
    from concurrent.futures import ThreadPoolExecutor

    uri = f"s3://{bucket}/runs/claims"
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: RunLocation(uri).create_exclusive("nodes/vm.json", f"{i}".encode()), range(8)))
    assert won.count(True) == 1
    assert RunLocation(uri).read("nodes/vm.json") == str(won.index(True)).encode()


def test_two_machines_with_one_host_name_both_run_on_s3(run_stallwatch, s3_env, bucket, tmp_path):
    """No --node: the second machine with the same default name gets the next free one and its job runs."""
    uri = f"s3://{bucket}/runs/same-host"
    env = {**s3_env, "POD_NAME": "trainer"}
    for _ in range(2):
        proc = run_stallwatch("run", "--interval", "200ms", "--flush-interval", "1", "--out", uri, "--",
                              sys.executable, "-c", "import time; time.sleep(0.5)", env=env,
                              timeout=SUBPROCESS_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
    assert "node name 'trainer' is taken" in proc.stderr
    assert stallwatch.open_run(uri).nodes == ["trainer", "trainer-2"]


def test_endpoint_down_for_the_whole_run(run_stallwatch, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    env = s3_environment(f"http://127.0.0.1:{closed_port()}", cache)
    uri = "s3://bkt/x"
    # The job sleeps a moment so that the sampler takes snapshots at all (see the report on short jobs).
    job = "import time; time.sleep(1); print('payload'); import sys; sys.exit(4)"
    t0 = time.monotonic()
    proc = run_stallwatch("run", "--interval", "200ms", "--flush-interval", "1", "--node", "n1", "--out", uri,
                          "--upload-timeout", "2", "--", sys.executable, "-c", job,
                          env=env, timeout=SUBPROCESS_TIMEOUT_S)
    took = time.monotonic() - t0
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == "payload\n"
    assert took < HANG_GUARD_S, f"took {took:.0f} s"

    kept = spool_dir(cache, uri, "n1")
    parquet = sorted(kept.glob("system/n1/*.parquet"))
    assert parquet and all(layout.parse_chunk(f"system/n1/{p.name}") for p in parquet), spool_files(cache)
    assert (kept / "run.json").exists() and (kept / "nodes" / "n1.json").exists()
    record = json.loads((kept / "nodes" / "n1.json").read_text())
    assert record["status"] == "finished" and record["exit_code"] == 4
    said = [line for line in proc.stderr.splitlines() if "could not be uploaded" in line]
    assert len(said) == 1 and str(kept) in said[0], proc.stderr
    # What was kept is a run directory of its own: readable as it is, uploadable later.
    local = stallwatch.open_run(str(kept))
    assert local.system().num_rows > 0 and local.info["nodes"]["n1"]["exit_code"] == 4


def test_endpoint_that_never_answers(run_stallwatch, tmp_path):
    hole = BlackHole()
    try:
        cache = tmp_path / "cache"
        env = s3_environment(f"http://127.0.0.1:{hole.port}", cache)
        uri = "s3://bkt/slow"
        upload_timeout = 2
        job = ("import sys, time; print('job started', file=sys.stderr, flush=True); time.sleep(1); print('payload'); "
               "raise SystemExit(5)")
        t0 = time.monotonic()
        proc = run_stallwatch("run", "--interval", "200ms", "--flush-interval", "1", "--node", "n1", "--out", uri,
                              "--upload-timeout", str(upload_timeout), "--", sys.executable, "-c", job,
                              env=env, timeout=SUBPROCESS_TIMEOUT_S)
        took = time.monotonic() - t0
        assert hole.accepted > 0, "nothing ever connected to the endpoint"
    finally:
        hole.close()
    assert proc.returncode == 5, proc.stderr
    assert proc.stdout == "payload\n"
    # The job starts once its node's claim is given up (--upload-timeout): the live rules read the store only
    # after that. Before, their first request (10 s to time out here) held the launcher's, and the job's start.
    lines = proc.stderr.splitlines()
    started = lines.index("job started")
    assert not [ln for ln in lines[:started] if "rule" in ln], proc.stderr
    # Hang guard: a fixed margin over the upload timeout, well below what one stuck request used to cost.
    assert took < upload_timeout + 35, f"took {took:.0f} s\n{proc.stderr}"
    kept = spool_dir(cache, uri, "n1")
    assert sorted(kept.glob("system/n1/*.parquet")), spool_files(cache)


def test_live_tail_over_s3(s3_env, bucket, tmp_path):
    uri = f"s3://{bucket}/runs/live"
    cmd = [sys.executable, "-m", "stallwatch.cli", "run", "--interval", "200ms", "--flush-interval", "1",
           "--node", "live", "--out", uri, "--", sys.executable, "-c", "import time; time.sleep(10)"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **s3_env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        run = None
        while run is None:
            try:
                run = stallwatch.open_run(uri)
            except RunNotFoundError:
                assert time.monotonic() < deadline and proc.poll() is None, "the run never appeared"
                time.sleep(0.3)
        tail = run.tail_system(metrics=["cpu_util"])
        batches = []  # (newest timestamp before, rows of this read) for reads made while the job runs
        last = None
        while proc.poll() is None and len([b for b in batches if b]) < 3 and time.monotonic() < deadline:
            t = tail.read()
            stamps = sorted(set(t.column("timestamp_us").to_pylist()))
            if stamps:
                assert last is None or stamps[0] > last, "a read returned rows it had returned before"
                last = stamps[-1]
            batches.append(stamps)
            time.sleep(1.2)
        assert len([b for b in batches if b]) >= 2, f"live reads gave {[len(b) for b in batches]} snapshots"
        assert proc.poll() is None or len([b for b in batches if b]) >= 3
    finally:
        try:
            out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, err
    rest = tail.read()
    total = sum(len(b) for b in batches) + len(set(rest.column("timestamp_us").to_pylist()))
    assert total == run.info["nodes"]["live"]["samples_written"]


def test_what_an_outage_kept_in_the_spool_can_be_uploaded_later(run_stallwatch, tmp_path, s3_server, bucket,
                                                                 monkeypatch):
    """`stallwatch upload SPOOL URI`, as the outage's log line says, completes the run on S3; again is a no-op."""
    cache = tmp_path / "cache"
    down = s3_environment(f"http://127.0.0.1:{closed_port()}", cache)
    uri = f"s3://{bucket}/runs/late"
    job = "import time; time.sleep(1)"
    proc = run_stallwatch("run", "--interval", "200ms", "--flush-interval", "1", "--node", "n1", "--out", uri,
                          "--upload-timeout", "1", "--", sys.executable, "-c", job, env=down, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    kept = spool_dir(cache, uri, "n1")
    said = [line for line in proc.stderr.splitlines() if "stallwatch upload" in line]
    assert len(said) == 1 and f"stallwatch upload {kept} {uri}" in said[0], proc.stderr
    local_rows = stallwatch.open_run(str(kept)).system().num_rows
    assert local_rows > 0

    up = s3_environment(s3_server.endpoint, cache)
    first = run_stallwatch("upload", str(kept), uri, env=up, timeout=SUBPROCESS_TIMEOUT_S)
    assert first.returncode == 0, first.stderr
    again = run_stallwatch("upload", str(kept), uri, "--delete", env=up, timeout=SUBPROCESS_TIMEOUT_S)
    assert again.returncode == 0 and "copied 0 file(s)" in again.stdout, again.stdout + again.stderr
    assert not any(p.is_file() for p in kept.rglob("*"))  # --delete removed the local copy

    for k, v in up.items():
        monkeypatch.setenv(k, v)
    remote = stallwatch.open_run(uri)
    assert remote.system().num_rows == local_rows
    assert remote.info["nodes"]["n1"]["status"] == "finished"


def test_upload_to_a_dead_endpoint_keeps_the_local_copy(run_stallwatch, tmp_path):
    src = tmp_path / "src"
    (src / "nodes").mkdir(parents=True)
    (src / "nodes" / "n1.json").write_text('{"node": "n1"}')
    env = s3_environment(f"http://127.0.0.1:{closed_port()}", tmp_path / "cache")
    proc = run_stallwatch("upload", str(src), "s3://bkt/dead", "--delete", env=env, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 1 and "Nothing in" in proc.stderr, proc.stderr
    assert (src / "nodes" / "n1.json").exists()


def test_straggler_reads_a_run_on_s3_again_with_the_result_of_memory(s3_env, bucket, tmp_path, monkeypatch):
    """Past its budget of kept steps Straggler lets them go and reads the run again, a block of step numbers at a
    time, node by node: on S3 that is one listing and ranged reads of the same objects, with the same result as
    every step held. Two nodes × two ranks, one rank 30 % slower; everything replayed (KEEP_BYTES = 0)."""
    from stallwatch.analyze.judge import feed
    from stallwatch.analyze.rules import straggler, straggler_excess, straggler_replay
    from stallwatch.analyze.judge.feed import iter_run, read_run
    from stallwatch.analyze.judge.runner import evaluate
    from stallwatch.store.transfer import copy_run
    from tests.analyze.rules._fw_gen import FwGen, write_events
    from tests.run_builder import T0, make_run

    gen = FwGen()
    for node in ("algo-1", "algo-2"):
        for rank in (0, 1):
            slow = node == "algo-2" and rank == 1
            gen.steps(node=node, rank=rank, n=300, start_us=T0 + 1_000_000, step_us=130_000 if slow else 100_000,
                      seed=rank)
    make_run(tmp_path / "run", seconds=50)
    write_events(tmp_path / "run", gen.table())
    uri = f"s3://{bucket}/runs/straggler"
    copy_run(RunLocation(str(tmp_path / "run")), RunLocation(uri))
    run = stallwatch.open_run(uri)

    (memory,) = [r.to_json() for r in evaluate([straggler.Straggler], [read_run(run, [straggler.Straggler])])]
    monkeypatch.setattr(straggler, "KEEP_BYTES", 0)
    monkeypatch.setattr(straggler_excess, "SPAN", 64)
    monkeypatch.setattr(straggler_replay, "REPLAY_CELLS", 4 * 64)  # a block of 64 step numbers: 5 blocks, 10 pieces
    pieces = []
    real = feed.RunReplay.__call__

    def counted(self, asked, **kw):
        pieces.extend(asked)
        return real(self, asked, **kw)

    monkeypatch.setattr(feed.RunReplay, "__call__", counted)
    (replayed,) = [r.to_json() for r in evaluate([straggler.Straggler], iter_run(run, [straggler.Straggler]))]
    assert {node for node, _, _ in pieces} == {"algo-1", "algo-2"} and len(pieces) == 10
    assert replayed["Details"]["ranks"] and json.dumps(replayed, sort_keys=True) == json.dumps(memory, sort_keys=True)


def test_a_slow_endpoint_holds_run_after_the_job_only_as_long_as_the_upload_timeout_says(s3_server, bucket, tmp_path):
    """Every request to the store held 1 s (a loaded endpoint), `--upload-timeout 5`: `stallwatch run` returns
    within the timeouts it was given after the job, with its summary and rules (evaluated on the local copy the
    upload left). Before, it waited up to 120 s for the live rules' last pass over the slow store (87 s here:
    the job's allocation held for nothing)."""
    proxy = SlowProxy(s3_server.port, delay_s=1.0)
    env = {**os.environ, **s3_environment(proxy.endpoint, tmp_path / "cache")}
    ended = tmp_path / "ended"
    try:
        proc = subprocess.run([sys.executable, "-m", "stallwatch.cli", "run", "--report", "off", "--upload-timeout",
                               "5", "--out", f"s3://{bucket}/runs/slow", "--", "sh", "-c",
                               f"sleep 3; date +%s.%N > {ended}"], env=env, stderr=subprocess.PIPE, text=True,
                              timeout=SUBPROCESS_TIMEOUT_S, cwd=tmp_path)
        returned = time.time()
    finally:
        proxy.close()
    assert proc.returncode == 0, proc.stderr
    assert "OverallSystemUsage" in proc.stderr  # the rules' table: evaluated, not skipped
    # Two waits bounded by --upload-timeout (the sampler's last upload, the rules' last pass) and the start of
    # a Python process or two: far below the 120 s the rules' wait alone could take.
    assert returned - float(ended.read_text()) < 60, proc.stderr
