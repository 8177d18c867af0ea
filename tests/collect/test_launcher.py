"""`stallwatch run -- CMD` end to end, through the real command line, with real processes and files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stallwatch import records as r

from ._support import (PAYLOAD, STALLWATCH, Background, job, node_record, read_json, snapshot_times, stallwatch, system_table,
                       wait_until)

INTERVAL_MS = 200


def test_one_snapshot_per_interval_with_every_metric(tmp_path):
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off", "--interval", f"{INTERVAL_MS}ms", "--flush-interval", "1",
                   "--out", str(run), "--node", "n1", "--", "sleep", "3")
    assert p.returncode == 0, p.stderr
    times = snapshot_times(run, "n1")
    expected = 3.0 / (INTERVAL_MS / 1000)
    assert 0.6 * expected <= len(times) <= 1.2 * expected + 1, (len(times), expected)
    gaps_ms = [(b - a) / 1000 for a, b in zip(times, times[1:])]
    assert 0.5 * INTERVAL_MS <= statistics.median(gaps_ms) <= 1.5 * INTERVAL_MS, gaps_ms

    table = system_table(run, "n1")
    present = {(d, m) for d, m in zip(table.column("device").to_pylist(), table.column("metric").to_pylist())}
    cores = node_record(run, "n1")["cpu_cores_logical"]
    wanted = {(r.CPU, r.CPU_UTIL), (r.CPU, r.CPU_IOWAIT), (r.MEMORY, r.MEM_UTIL), (r.MEMORY, r.MEM_USED_BYTES),
              (r.DISK, r.DISK_READ_BPS), (r.DISK, r.DISK_WRITE_BPS), (r.NET, r.NET_RX_BPS), (r.NET, r.NET_TX_BPS),
              (r.PROC, r.PROC_CPU_UTIL), (r.PROC, r.PROC_RSS_BYTES), (r.PROC, r.PROC_COUNT),
              (r.PROC, r.WORKERS_ALIVE), (r.PROC, r.WORKERS_BUSY), (r.PROC, r.WORKERS_CPU_UTIL)}
    wanted |= {(f"cpu{i}", r.CPU_UTIL) for i in range(cores)} | {(f"cpu{i}", r.CPU_IOWAIT) for i in range(cores)}
    assert wanted <= present, sorted(wanted - present)
    # no GPU here: no GPU series, and the node says why
    assert not any(d.startswith("gpu") for d, _ in present)
    node = node_record(run, "n1")
    assert node["gpus"] == [] and "NVML" in node["gpu_absent_reason"]
    assert node["status"] == "finished" and node["exit_code"] == 0
    assert node["sample_interval_ms"] == INTERVAL_MS
    # the sampler's own cost, for the report: some CPU, and a resident size of tens of MB (an interpreter)
    assert 0 < node["sampler_cpu_s"] < 60 and 10e6 < node["sampler_max_rss_bytes"] < 2e9
    # the job was followed: `sleep` is one process, with memory, for most of the snapshots
    counts = [v for d, m, v in zip(table.column("device").to_pylist(), table.column("metric").to_pylist(),
                                    table.column("value").to_pylist()) if (d, m) == (r.PROC, r.PROC_COUNT)]
    assert counts.count(1.0) >= 0.5 * len(times), counts
    # values are in range
    for d, m, v in zip(table.column("device").to_pylist(), table.column("metric").to_pylist(),
                       table.column("value").to_pylist()):
        if m.endswith("_util") or m == r.CPU_IOWAIT:
            assert 0.0 <= v <= 100.0, (d, m, v)
        else:
            assert v >= 0.0, (d, m, v)
    assert "n1" in p.stderr and "snapshots" in p.stderr  # the summary


@pytest.mark.parametrize("command, code", [
    (["sh", "-c", "exit 3"], 3),
    ([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], 137),
    ([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], 143),
    (["no-such-command-for-stallwatch"], 127),
])
def test_exit_codes_propagate(tmp_path, command, code):
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off",
                   "--interval", "100ms", "--out", str(run), "--node", "n", "--", *command)
    assert p.returncode == code, p.stderr
    node = node_record(run, "n")
    assert node["exit_code"] == code and node["status"] == "finished"
    if code == 127:
        assert "no-such-command-for-stallwatch" in p.stderr and "No such file" in p.stderr


def test_a_command_that_is_not_executable_gives_126(tmp_path):
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    p = stallwatch(tmp_path, "run", "--report", "off",
                   "--interval", "100ms", "--out", str(tmp_path / "run"), "--", str(script))
    assert p.returncode == 126, p.stderr
    assert "Permission denied" in p.stderr


def test_stdout_is_unchanged_byte_for_byte(tmp_path):
    p = stallwatch(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(tmp_path / "run"), "--",
                   *job(tmp_path, "time.sleep(0.3)", exit_code=0))
    assert p.returncode == 0, p.stderr
    assert p.stdout == PAYLOAD
    assert "stallwatch:" in p.stderr  # the summary goes to stderr, never into the command's stdout


def test_stdin_reaches_the_command(tmp_path):
    full_env = dict(os.environ)
    p = subprocess.run([*STALLWATCH, "run", "--report", "off",
                        "--interval", "100ms", "--out", str(tmp_path / "run"), "--",
                        sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read()[::-1])"],
                       input=b"abc\xc3\xa9\n", capture_output=True, timeout=60, env=full_env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "\n\u00e9cba".encode()  # "abcé\n" reversed, by the command itself


def _trap_job(tmp_path: Path, signame: str) -> list[str]:
    return [sys.executable, "-c",
            "import signal, sys, time, os\n"
            f"def on(sig, frame):\n"
            f"    open({str(tmp_path / 'marker')!r}, 'w').write('got ' + signal.Signals(sig).name)\n"
            f"    sys.exit(0)\n"
            f"signal.signal(signal.{signame}, on)\n"
            f"open({str(tmp_path / 'started')!r}, 'w').write(str(os.getpid()))\n"
            "time.sleep(60)\n"
            "sys.exit(9)\n"]


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_signals_to_the_launcher_reach_the_command(tmp_path, signame):
    bg = Background(tmp_path, "run", "--report", "off",
                    "--interval", "100ms", "--out", str(tmp_path / "run"), "--node", "n", "--",
                    *_trap_job(tmp_path, signame))
    try:
        wait_until(lambda: (tmp_path / "started").exists(), 30, what="the command to start")
        bg.proc.send_signal(getattr(signal, signame))
        assert bg.wait(timeout=60) == 0, bg.stderr
    finally:
        bg.kill_all()
    assert (tmp_path / "marker").read_text() == f"got {signame}"
    node = node_record(tmp_path / "run", "n")
    assert node["exit_code"] == 0 and node["status"] == "finished"


def test_sigterm_to_a_command_that_does_not_trap_it_gives_143(tmp_path):
    bg = Background(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(tmp_path / "run"), "--",
                    "sh", "-c", f"echo $$ > {tmp_path / 'started'}; exec sleep 60")
    try:
        wait_until(lambda: (tmp_path / "started").exists(), 30, what="the command to start")
        bg.proc.send_signal(signal.SIGTERM)
        assert bg.wait(timeout=60) == 143, bg.stderr
    finally:
        bg.kill_all()


def _tree(root: Path) -> dict[str, tuple[int, int, str]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_requeued_node_runs_its_job_as_a_new_attempt_and_keeps_the_first(tmp_path, run_stallwatch):
    """A second `stallwatch run --node a` into a run whose node `a` has ended (a Slurm requeue, a restarted pod)
    runs its job as attempt 2 of `a`: every file of attempt 1 stays as it was, the node record keeps attempt 1.
    Before, it exited 2 without starting the job."""
    run = tmp_path / "run"
    first = run_stallwatch("run", "--report", "off",
                           "--interval", "100ms", "--out", str(run), "--node", "a", "--", "sleep", "0.5",
                           timeout=60)
    assert first.returncode == 0, first.stderr
    before = _tree(run)
    assert any(k.startswith("system/a/") for k in before) and "nodes/a.json" in before and "run.json" in before
    marker = tmp_path / "ran"
    second = run_stallwatch("run", "--report", "off", "--interval", "100ms", "--out", str(run), "--node", "a", "--",
                            "sh", "-c", f"touch {marker}; exit 3", timeout=60)
    assert second.returncode == 3, second.stderr
    assert marker.exists()  # the command ran
    assert "resumed as attempt 2 (attempt 1 ended with exit code 0)" in second.stderr, second.stderr
    after = _tree(run)
    data = [k for k in before if k.startswith(("system/", "framework/"))]
    assert data and {k: after.get(k) for k in data} == {k: before[k] for k in data}  # attempt 1's data as it was
    assert any(k.startswith("system/a/") and k not in before for k in after)  # attempt 2's data beside it
    node = read_json(run / "nodes" / "a.json")
    assert node["attempt"] == 2 and node["exit_code"] == 3, node
    (one,) = node["attempts"]
    assert one["attempt"] == 1 and one["exit_code"] == 0 and one["end_us"] < node["attempt_start_us"], one
    assert node["start_us"] == one["start_us"]  # the node's span covers both attempts
    assert sorted(p.name for p in (run / "nodes").glob("*.json")) == ["a.json"]
    info = run_stallwatch("info", str(run), timeout=60)
    assert "finished (attempt 2)" in info.stdout, info.stdout


def test_a_node_whose_attempt_still_runs_is_not_joined_but_the_job_runs(tmp_path, run_stallwatch):
    """The same --node while its first attempt still runs on this machine: two samplers would mix one node's
    data, so the second job runs under a name no other machine takes, said in one line."""
    run = tmp_path / "run"
    bg = Background(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--node", "a",
                    "--", "sleep", "30")
    try:
        wait_until(lambda: (read_json(run / "nodes" / "a.json") or {}).get("sampler_pid"), 30, what="node a")
        marker = tmp_path / "ran"
        second = run_stallwatch("run", "--report", "off", "--interval", "100ms", "--out", str(run), "--node", "a",
                                "--", "touch", str(marker), timeout=60)
    finally:
        bg.kill_all()
    assert second.returncode == 0, second.stderr
    assert marker.exists()
    assert "may still be running (its sampler (pid" in second.stderr, second.stderr
    names = sorted(p.name for p in (run / "nodes").glob("*.json"))
    other = [n for n in names if n != "a.json"]
    assert len(names) == 2 and "a.json" in names and other[0].startswith("a-"), names


def test_two_machines_with_one_default_name_both_run(tmp_path):
    """Started together without --node and with the same host name: both jobs run, as `vm` and `vm-2`; the
    claims (exclusive creates) never give one name twice."""
    run = tmp_path / "run"
    env = {"SLURMD_NODENAME": "vm"}
    a = Background(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--",
                   *job(tmp_path, "time.sleep(1)", exit_code=0), env=env, name="a")
    b = Background(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--",
                   *job(tmp_path, "time.sleep(1)", exit_code=0), env=env, name="b")
    try:
        assert a.wait(60) == 0, a.stderr
        assert b.wait(60) == 0, b.stderr
    finally:
        a.kill_all()
        b.kill_all()
    import stallwatch as sw

    assert sw.open_run(str(run)).nodes == ["vm", "vm-2"]
    assert a.stdout == PAYLOAD and b.stdout == PAYLOAD


class _SlowStore:
    """A run location whose claims answer after `delay_s` (an S3 endpoint under load), over a real local run."""

    remote = True

    def __init__(self, root: Path, delay_s: float) -> None:
        from stallwatch.store.location import RunLocation

        self.inner, self.delay_s, self.uri = RunLocation(str(root)), delay_s, str(root)
        self.landed: list[tuple[str, bool]] = []  # each claim that answered, once it did

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        time.sleep(self.delay_s)
        created = self.inner.create_exclusive(rel, data)
        self.landed.append((rel, created))
        return created

    def delete(self, rel: str) -> None:
        self.inner.delete(rel)


def test_a_store_slow_to_answer_a_claim_never_gives_two_machines_one_name(tmp_path):
    """Two writers became `vm` when the claim gave up after 2 s and wrote anyway, mixing their data. A claim
    answered within the patience holds; past it the machine takes a name no other takes, and the claim that
    lands late is taken back."""
    from stallwatch.collect.launcher import claim_node

    quick = _SlowStore(tmp_path / "run", 0.3)
    assert claim_node(quick, "vm", {"status": "starting"}, explicit=False, patience_s=2.5) == "vm"
    assert claim_node(quick, "vm", {"status": "starting"}, explicit=False, patience_s=2.5) == "vm-2"
    slow = _SlowStore(tmp_path / "run", 3.0)
    name = claim_node(slow, "vm", {"status": "starting"}, explicit=False, patience_s=0.1)
    assert name.startswith(f"vm-{os.getpid()}-") and name not in ("vm", "vm-2", "vm-3")
    # the late claim lands (3 s after it was made); one that created its file takes it back right after
    (late,) = wait_until(lambda: slow.landed, 30, what="the late claim to land")
    assert late[0] == "nodes/vm.json", late
    names = lambda: sorted(p.name for p in (tmp_path / "run" / "nodes").iterdir())  # noqa: E731
    wait_until(lambda: names() == ["vm-2.json", "vm.json"], 30, what="no node file but vm's and vm-2's")
    assert names() == ["vm-2.json", "vm.json"]


def test_two_nodes_build_one_run(tmp_path, run_stallwatch):
    run = tmp_path / "run"
    a = Background(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--node", "a", "--",
                   *job(tmp_path, "time.sleep(1.5)", exit_code=0), name="a")
    b = Background(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--node", "b", "--",
                   *job(tmp_path, "time.sleep(1.5)", exit_code=4), name="b")
    try:
        assert a.wait(60) == 0, a.stderr
        assert b.wait(60) == 4, b.stderr
    finally:
        a.kill_all()
        b.kill_all()
    assert a.stdout == PAYLOAD and b.stdout == PAYLOAD
    import stallwatch as sw

    opened = sw.open_run(str(run))
    assert opened.nodes == ["a", "b"]
    info = opened.info
    assert set(info["nodes"]) == {"a", "b"}
    assert info["nodes"]["a"]["exit_code"] == 0 and info["nodes"]["b"]["exit_code"] == 4
    assert info["created_by_node"] in ("a", "b")  # run.json written once, by whichever came first
    assert len(snapshot_times(run, "a")) >= 5 and len(snapshot_times(run, "b")) >= 5
    nodes_in_data = set(system_table(run).column("node").to_pylist())
    assert nodes_in_data == {"a", "b"}

    p = run_stallwatch("info", str(run), timeout=60)
    assert p.returncode == 0, p.stderr
    rows = {line.split()[0]: line.split() for line in p.stdout.splitlines() if line.split()[:1] in (["a"], ["b"])}
    assert set(rows) == {"a", "b"}, p.stdout
    assert "finished" in rows["a"] and "finished" in rows["b"]
    assert "metrics of a:" in p.stdout and "metrics of b:" in p.stdout


def test_info_on_something_that_is_not_a_run(tmp_path, run_stallwatch):
    p = run_stallwatch("info", str(tmp_path), timeout=60)
    assert p.returncode == 2
    assert "not a stallwatch run" in p.stderr


def test_no_command_is_a_usage_error(tmp_path, run_stallwatch):
    p = run_stallwatch("run", "--report", "off", "--out", str(tmp_path / "run"), "--", timeout=60)
    assert p.returncode == 2
    assert "give the command" in p.stderr
    assert not (tmp_path / "run").exists()


def test_the_job_is_told_where_its_run_is(tmp_path):
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--node", "n7", "--",
                   sys.executable, "-c",
                   "import os; print(os.environ['STALLWATCH_RUN'], os.environ['STALLWATCH_NODE'], "
                   "os.environ['STALLWATCH_RUN_ID'])")
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().split() == [str(run), "n7", "run"]


def test_an_unsupported_location_is_a_usage_error_before_anything_starts(tmp_path):
    """A gs:// URI is a typo'd flag like any other: refused at once with the form to use (exit 2, as argparse
    does), before the job starts, rather than a job that runs unprofiled or a local folder named 'gs:'."""
    p = stallwatch(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", "gs://bucket/run", "--",
                   *job(tmp_path, "", exit_code=6))
    assert p.returncode == 2 and p.stdout == b""
    assert "gs://" in p.stderr and "s3://bucket/prefix/run" in p.stderr
    assert not (tmp_path / "gs:").exists()


def test_a_job_stopped_and_continued_by_someone_else_keeps_the_launcher_running(tmp_path):
    """Outside a terminal (a scheduler suspending the job, a user's kill -STOP / -CONT), the launcher must
    not stop itself: it keeps waiting and returns the job's exit code once it ends."""
    code = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(2)\nraise SystemExit(7)\n"
    launcher = subprocess.Popen([*STALLWATCH, "run", "--report", "off",
                                 "--interval", "200ms", "--out", str(tmp_path / "run"), "--",
                                 sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL)
    try:
        job_pid = int(launcher.stdout.readline())
        os.kill(job_pid, signal.SIGSTOP)
        time.sleep(1.0)
        os.kill(job_pid, signal.SIGCONT)
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 7, err
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_signals_ignored_by_the_caller_stay_ignored_for_the_job(tmp_path):
    """Under nohup (SIGHUP ignored) a hangup must neither reach the job nor change its disposition."""
    code = ("import signal, time\n"
            "print('hup ignored' if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else 'hup default', flush=True)\n"
            "time.sleep(1.5)\nraise SystemExit(3)\n")
    launcher = subprocess.Popen([*STALLWATCH, "run", "--report", "off",
                                 "--interval", "200ms", "--out", str(tmp_path / "run"), "--",
                                 sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        assert launcher.stdout.readline().strip() == "hup ignored"
        launcher.send_signal(signal.SIGHUP)  # the terminal went away
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 3, err
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_a_launcher_killed_with_sigkill_takes_its_job_and_the_jobs_children_with_it(tmp_path):
    """`timeout -s KILL stallwatch run -- JOB`: the job and its children die with the launcher, as the job alone
    would without stallwatch; the sampler (its own session, which sees the launcher's lifeline close without
    the job's end) kills the job's process group and records the end. Before, they ran on, orphaned."""
    run = tmp_path / "run"
    pids = tmp_path / "pids"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    bg = Background(tmp_path, "run", "--report", "off", "--interval", "100ms", "--flush-interval", "0.5",
                    "--out", str(run), "--node", "n", "--", "sh", "-c", f"sleep 300 & echo $$ $! > {pids}; wait",
                    env={"TMPDIR": str(tmp)})
    try:
        wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, 30, what="the job and its child")
        wait_until(lambda: list((run / "system" / "n").glob("*")), 30, what="the sampler's first data")
        time.sleep(0.5)  # the job's pid, sent when it started, is taken within a sampling interval
        job_pid, child_pid = (int(p) for p in pids.read_text().split())
        bg.proc.kill()
        bg.proc.wait(10)

        def gone(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True
        wait_until(lambda: gone(job_pid) and gone(child_pid), 30, what="the job and its child to die")
        record = wait_until(lambda: (r := read_json(run / "nodes" / "n.json")) and r.get("status") == "finished" and r,
                            30, what="the node's end")
    finally:
        bg.kill_all()
        for pid in (locals().get("job_pid"), locals().get("child_pid")):
            if pid:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    assert record["exit_signal"] == "SIGKILL" and record["exit_code"] == 137, record
    assert "ended without a word" in bg.stderr, bg.stderr
    wait_until(lambda: not list(tmp.glob("stallwatch-*")), 30, what="the sampler to remove the private folder")


def test_a_private_folder_left_by_a_killed_launcher_and_sampler_is_removed_by_the_next_command(tmp_path):
    """Launcher and sampler both killed (SIGKILL): nothing is left to remove their private folder (event socket,
    journal, staging). The next command on this machine that opens the run removes it, in one line saying what
    it still held; a folder of another run, or of a launcher still running, stays."""
    run = tmp_path / "run"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    bg = Background(tmp_path, "run", "--report", "off", "--interval", "100ms", "--flush-interval", "0.5",
                    "--out", str(run), "--node", "n", "--", "sleep", "300", env={"TMPDIR": str(tmp)})
    other = tmp / "stallwatch-other"
    other.mkdir()
    (other / "owner.json").write_text(json.dumps({"run": str(tmp_path / "elsewhere"), "node": "n", "pid": 1 << 22,
                                                  "host": socket.gethostname()}))
    try:
        wait_until(lambda: list((run / "system" / "n").glob("*")), 30, what="the sampler's first data")
        (left,) = [p for p in tmp.glob("stallwatch-*") if p != other]
        sampler = next(p for p in psutil.Process(bg.proc.pid).children() if "sampler_process" in " ".join(p.cmdline()))
        job = next(p for p in psutil.Process(bg.proc.pid).children() if p.pid != sampler.pid)
        (left / "staging" / "unacked-1-2.lines").write_bytes(b"x" * 1000)  # as a job process leaves them
        sampler.send_signal(signal.SIGSTOP)  # it cannot see its launcher go, so it cannot clean up
        bg.proc.kill()
        bg.proc.wait(10)
        sampler.kill()
        job.kill()
    finally:
        bg.kill_all()
    assert left.exists()
    p = stallwatch(tmp_path, "info", str(run), env={"TMPDIR": str(tmp)})
    assert p.returncode == 0, p.stderr
    assert not left.exists() and other.exists()
    (line,) = [x for x in p.stderr.splitlines() if "removed" in x]
    assert str(left) in line and "node 'n'" in line and "killed" in line and "never stored" in line, line


def test_the_in_job_api_whose_sampler_pipe_closes_is_never_killed(tmp_path):
    """With the in-job API the job process starts the sampler itself and is recorded as the job: a pipe it closes
    (the profile object dropped without stopping it) is no launcher's death, so nothing is killed."""
    script = tmp_path / "api_job.py"
    script.write_text(
        "import sys, time\n"
        "import stallwatch.torch as swt\n"
        f"prof = swt.profile(out={str(tmp_path / 'run')!r}, node='n')\n"
        "prof.__enter__()\n"
        "time.sleep(1.0)\n"
        "prof._node.sampler.proc.stdin.close()  # as if the handle were dropped\n"
        "time.sleep(2.0)\n"
        "print('alive', flush=True)\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "alive" in p.stdout, (p.returncode, p.stderr)
