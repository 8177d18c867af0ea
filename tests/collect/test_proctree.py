"""The job's process tree: which children are data-loader workers, and counting them in a real job."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stallwatch import records as r
from stallwatch.collect import procfs
from stallwatch.collect.proctree import PROC_METRICS, ProcessTreeReader, looks_like_worker

PY = "/usr/bin/python3"


# -- looks_like_worker --------------------------------------------------------------------------------------
def test_forked_child_has_its_parents_command_line():
    train = [PY, "train.py", "--epochs", "3"]
    assert looks_like_worker(list(train), list(train))


def test_spawned_worker_is_recognised_by_multiprocessing_spawn():
    spawned = [PY, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
               "--multiprocessing-fork"]
    assert looks_like_worker(spawned, [PY, "train.py"])
    assert looks_like_worker(spawned, None)


def test_fork_server_and_resource_tracker_are_helpers_not_workers():
    server = [PY, "-B", "-c", "from multiprocessing.forkserver import main; main(3, 5, ['__main__'], **{})"]
    tracker = [PY, "-B", "-c", "from multiprocessing.resource_tracker import main;main(3)"]
    assert not looks_like_worker(server, [PY, "train.py"])
    assert not looks_like_worker(tracker, [PY, "train.py"])
    # what the fork server forks for each worker carries the server's command line
    assert looks_like_worker(list(server), list(server))


def test_other_children_are_not_workers():
    assert not looks_like_worker(["nvidia-smi"], [PY, "train.py"])
    assert not looks_like_worker(["/bin/sh", "-c", "tar xf data.tar"], [PY, "train.py"])
    assert not looks_like_worker([PY, "eval.py"], [PY, "train.py"])
    assert not looks_like_worker([PY, "train.py"], None)
    assert not looks_like_worker([], [])  # kernel threads and zombies have no command line


# -- a real job ---------------------------------------------------------------------------------------------
JOB = r'''
import multiprocessing as mp, os, sys, time

def spin(stop):
    while not os.path.exists(stop):
        for _ in range(20000):
            pass

if __name__ == "__main__":
    method, stop, reap = sys.argv[1], sys.argv[2], sys.argv[3] == "reap"
    ctx = mp.get_context(method)
    procs = [ctx.Process(target=spin, args=(stop,)) for _ in range(3)]
    for p in procs:
        p.start()
    print("started", flush=True)
    while not os.path.exists(stop):
        time.sleep(0.05)
    if reap:
        for p in procs:
            p.join()
    else:  # wait until they have exited, but leave them unreaped (zombies)
        for p in procs:
            os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
    print("workers done", flush=True)
    sys.stdin.read()
'''

V = {m: i for i, m in enumerate(PROC_METRICS)}


def values(reader: ProcessTreeReader) -> dict[str, float]:
    out = reader.read()
    assert len(out) == len(PROC_METRICS) == len(reader.keys())
    return {m: out[i] for m, i in V.items()}


@pytest.fixture
def job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    started: list[subprocess.Popen] = []

    def start(method: str, reap: bool) -> tuple[subprocess.Popen, Path]:
        stop = tmp_path / f"stop-{len(started)}"
        p = subprocess.Popen([sys.executable, str(script), method, str(stop), "reap" if reap else "keep"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout.readline().strip() == "started"
        return p, stop

    yield start
    for p in started:
        if p.poll() is None:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
        p.wait(timeout=30)


def wait_for(reader: ProcessTreeReader, pred, timeout: float = 20.0, period: float = 0.3) -> dict[str, float]:
    """Read until `pred(values)` holds; the last values either way (the assertion shows them)."""
    deadline = time.monotonic() + timeout
    v = values(reader)
    while not pred(v) and time.monotonic() < deadline:
        time.sleep(period)
        v = values(reader)
    return v


def finish(proc: subprocess.Popen, stop: Path) -> None:
    stop.touch()
    assert proc.stdout.readline().strip() == "workers done"


@pytest.mark.parametrize("kept", [256, 2], ids=["files-kept-open", "two-kept-the-rest-by-path"])
def test_three_forked_workers_alive_and_busy_then_gone(job, monkeypatch, kept):
    """With their /proc files kept open, or past MAX_KEPT_OPEN read by path (a tree of thousands of processes
    must not take the sampler's file descriptors): the same readings."""
    from stallwatch.collect import proctree

    monkeypatch.setattr(proctree, "MAX_KEPT_OPEN", kept)
    proc, stop = job("fork", reap=True)
    reader = ProcessTreeReader(cores=psutil.cpu_count() or 1, refresh_s=0.2)
    assert values(reader) == {m: 0.0 for m in PROC_METRICS}  # no root yet: zeros
    reader.set_root(proc.pid)
    v = wait_for(reader, lambda v: v[r.WORKERS_ALIVE] == 3 and v[r.WORKERS_BUSY] == 3)
    assert v[r.WORKERS_ALIVE] == 3 and v[r.WORKERS_BUSY] == 3, v
    assert v[r.PROC_COUNT] == 4, v
    assert v[r.WORKERS_CPU_UTIL] > 0 and v[r.PROC_CPU_UTIL] >= v[r.WORKERS_CPU_UTIL], v
    assert v[r.PROC_RSS_BYTES] > 4 * 1_000_000, v  # four Python processes
    open_files = sum(m.stat is not None for m in reader._members.values())
    assert open_files == reader._kept_open == min(kept, 4)

    finish(proc, stop)
    v = wait_for(reader, lambda v: v[r.WORKERS_ALIVE] == 0)
    assert v[r.WORKERS_ALIVE] == 0 and v[r.WORKERS_BUSY] == 0 and v[r.PROC_COUNT] == 1, v

    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    v = values(reader)
    assert v == {m: 0.0 for m in PROC_METRICS}, v
    assert reader._kept_open == 0  # every kept file closed with its process


def test_exited_but_unreaped_workers_are_not_alive(job):
    proc, stop = job("fork", reap=False)
    reader = ProcessTreeReader(cores=psutil.cpu_count() or 1, refresh_s=0.2)
    reader.set_root(proc.pid)
    v = wait_for(reader, lambda v: v[r.WORKERS_ALIVE] == 3)
    assert v[r.WORKERS_ALIVE] == 3, v
    finish(proc, stop)
    zombies = [c for c in psutil.Process(proc.pid).children() if c.status() == psutil.STATUS_ZOMBIE]
    assert len(zombies) == 3  # the situation under test is real
    v = wait_for(reader, lambda v: v[r.WORKERS_ALIVE] == 0, timeout=5)
    assert v[r.WORKERS_ALIVE] == 0 and v[r.PROC_COUNT] == 1, v


def test_forkserver_workers_count_but_not_the_fork_server(job):
    proc, stop = job("forkserver", reap=True)
    reader = ProcessTreeReader(cores=psutil.cpu_count() or 1, refresh_s=0.2)
    reader.set_root(proc.pid)
    v = wait_for(reader, lambda v: v[r.WORKERS_BUSY] == 3)
    assert v[r.WORKERS_ALIVE] == 3 and v[r.WORKERS_BUSY] == 3, v
    # root + fork server + resource tracker + 3 workers
    assert v[r.PROC_COUNT] == len(psutil.Process(proc.pid).children(recursive=True)) + 1, v
    finish(proc, stop)


def test_a_root_that_does_not_exist_gives_zeros():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    reader = ProcessTreeReader(cores=2, refresh_s=0.2)
    reader.set_root(p.pid)
    assert values(reader) == {m: 0.0 for m in PROC_METRICS}


def test_tree_is_rescanned_often_while_it_changes_and_rarely_while_it_is_stable(monkeypatch) -> None:
    """Finding children costs a scan of /proc: back off from 0.5 s to 10 s while the tree is unchanged,
    and look again at the next snapshot once a member exits (e.g. an epoch's workers ending)."""
    import subprocess
    import sys
    import types

    from stallwatch.collect import proctree

    clock = types.SimpleNamespace(t=100.0)
    monkeypatch.setattr(proctree, "time", types.SimpleNamespace(monotonic=lambda: clock.t))
    scans = []
    real_scan = proctree.ProcessTreeReader._scan
    monkeypatch.setattr(proctree.ProcessTreeReader, "_scan", lambda self: (scans.append(clock.t), real_scan(self)))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reader = proctree.ProcessTreeReader(cores=2)
        reader.set_root(child.pid)
        for _ in range(400):  # 40 s of snapshots at 100 ms
            clock.t += 0.1
            reader.read()
        gaps = [round(b - a, 1) for a, b in zip(scans, scans[1:])]
        # Scans happen at the first snapshot at or after each due time (snapshots are 0.1 s apart).
        for gap, due in zip(gaps, [0.5, 1.0, 2.0, 4.0, 8.0] + [10.0] * (len(gaps) - 5)):
            assert due <= gap <= due + 0.1
        assert len(gaps) >= 7
        child.kill()
        child.wait()
        before = len(scans)
        clock.t += 0.1
        assert reader.read()[2] == 0.0  # num_procs: the root is gone
        clock.t += 0.1
        reader.read()
        assert len(scans) == before + 1  # rescanned at once, not 10 s later
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not procfs.AVAILABLE, reason="Linux /proc only")
def test_children_and_grandchildren_born_later_are_found_without_walking_the_machine(monkeypatch) -> None:
    """Between whole walks a look reads only the processes born since the last one: a child and its own
    child started later are members within a look or two; a process born elsewhere is not."""
    walks = []
    real_walk = ProcessTreeReader._scan_all
    monkeypatch.setattr(ProcessTreeReader, "_scan_all", lambda self: (walks.append(1), real_walk(self)))
    nested = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "time.sleep(60)\n")
    root_code = ("import subprocess, sys\nsys.stdin.readline()\n"
                 f"subprocess.Popen([sys.executable, '-c', {nested!r}])\nsys.stdin.readline()\n")
    root = subprocess.Popen([sys.executable, "-c", root_code], stdin=subprocess.PIPE, text=True)
    stranger = None
    try:
        reader = ProcessTreeReader(cores=2, refresh_s=0.2)
        reader.set_root(root.pid)
        assert values(reader)[r.PROC_COUNT] == 1.0
        stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        root.stdin.write("go\n")
        root.stdin.flush()
        time.sleep(1.0)  # both born before the next look
        v = wait_for(reader, lambda v: v[r.PROC_COUNT] >= 3.0, period=0.25)
        assert v[r.PROC_COUNT] == 3.0
        assert len(walks) == 1  # the first look only
        assert stranger.pid not in reader._members

        def unlistable() -> set[int]:
            raise OSError(24, "Too many open files")

        monkeypatch.setattr(procfs, "pids", unlistable)  # /proc cannot be listed: the whole walk, every look
        reader._next_refresh = 0.0
        assert values(reader)[r.PROC_COUNT] == 3.0 and len(walks) == 2
    finally:
        for child in psutil.Process(root.pid).children(recursive=True):
            child.kill()
        root.kill()
        root.wait()
        if stranger is not None:
            stranger.kill()
            stranger.wait()
