"""When things break around the job — full disk, failing GPUs, a dead sampler, a bad config, a killed job or
launcher — the job still ends with its own exit code and its own output, and as little data as possible is lost.

Numbers measured here (samples lost, gaps) are printed with -s for the report; assertions use generous bounds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from stallwatch import records as r

from ._support import (
    FAKE_PYNVML_DIR,
    PAYLOAD,
    SAMPLER_MODULE,
    Background,
    job,
    node_record,
    now_us,
    pythonpath_with,
    read_json,
    series,
    snapshot_times,
    stallwatch,
    wait_until,
)


def report(name: str, **facts) -> None:
    print(f"\n[measured] {name}: " + ", ".join(f"{k}={v}" for k, v in facts.items()))


def lines_matching(text: str, pattern: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(pattern, line)]


# -- (a) the disk fills up ----------------------------------------------------------------------------------
@pytest.fixture
def tiny_disk():
    """A 128 KiB tmpfs; skipped where mounting is not permitted."""
    yield from _tmpfs("128k")


@pytest.fixture
def small_disk():
    """A 2 MiB tmpfs: once its filler is gone, room for a few hundred parts however long a busy machine makes the job."""
    yield from _tmpfs("2m")


def _tmpfs(size: str):
    where = Path(tempfile.mkdtemp(prefix="stallwatch-tinyfs-"))
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                 capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        where.rmdir()
        pytest.skip(f"cannot run mount: {exc}")
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)
        where.rmdir()


def fill(disk: Path, leave_bytes: int) -> Path:
    """Fill `disk` until at most `leave_bytes` are free; returns the filler file."""
    filler = disk / "filler"
    with open(filler, "wb") as fh:
        try:
            while os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize > leave_bytes:
                fh.write(b"\0" * 4096)
                fh.flush()
        except OSError:
            pass
    return filler


def test_disk_fills_up_during_the_run(tmp_path, tiny_disk):
    fill(tiny_disk, leave_bytes=8 * 4096)  # room for the run's first files and a few parts
    run = tiny_disk / "run"
    p = stallwatch(tmp_path, "run", "--interval", "100ms", "--flush-interval", "0.2", "--out", str(run),
                   "--node", "n", "--", *job(tmp_path, "time.sleep(2.5)", exit_code=5))
    assert p.returncode == 5, p.stderr
    assert p.stdout == PAYLOAD
    assert (run / "nodes" / "n.json").exists()  # it started with space
    failing = lines_matching(p.stderr, r"cannot write system/n/")
    assert len(failing) == 1 and "No space left on device" in failing[0], p.stderr
    # once each at most: parts, node record, live counts, rule results, findings, report
    assert len(lines_matching(p.stderr, "No space left")) <= 6, p.stderr
    assert not [f for f in run.rglob("*") if f.name.endswith(".tmp")]  # no half-written files left
    stored = snapshot_times(run, "n")  # what was stored is readable
    report("disk full mid-run", stored_snapshots=len(stored))


def test_disk_full_from_the_start(tmp_path, tiny_disk):
    fill(tiny_disk, leave_bytes=0)
    run = tiny_disk / "run"
    p = stallwatch(tmp_path, "run", "--interval", "100ms", "--flush-interval", "0.2", "--out", str(run),
                   "--node", "n", "--", *job(tmp_path, "time.sleep(1)", exit_code=5))
    assert p.returncode == 5, p.stderr
    assert p.stdout == PAYLOAD
    assert "Traceback" not in p.stderr
    assert len(lines_matching(p.stderr, "cannot write the run directory")) == 1, p.stderr
    assert len(lines_matching(p.stderr, "No space left")) <= 4, p.stderr


def test_disk_full_from_the_start_leaves_no_temporary_files(tmp_path, tiny_disk):
    fill(tiny_disk, leave_bytes=0)
    run = tiny_disk / "run"
    p = stallwatch(tmp_path, "run", "--interval", "100ms", "--out", str(run), "--node", "n", "--", "true")
    assert p.returncode == 0, p.stderr
    assert [f.name for f in run.rglob("*.tmp")] == []


def test_space_freed_during_the_run_loses_nothing(tmp_path, small_disk):
    filler = fill(small_disk, leave_bytes=6 * 4096)
    run = small_disk / "run"
    freed = tmp_path / "freed"
    # the space is freed once a write has failed (however late a busy machine starts the sampler), then the job
    # runs on for 1.5 s: the writer finds out it works again and writes what it held
    body = f"while not os.path.exists({str(freed)!r}):\n    time.sleep(0.05)\ntime.sleep(1.5)"
    launched = Background(tmp_path, "run", "--interval", "100ms", "--flush-interval", "0.2", "--out", str(run),
                          "--node", "n", "--", *job(tmp_path, body, exit_code=0))
    try:
        wait_until(lambda: lines_matching(launched.stderr, r"cannot write system/n/"), timeout=120,
                   what="a write to fail on the full disk")
        filler.unlink()
        freed.touch()
        assert launched.wait(120) == 0, launched.stderr
    finally:
        launched.kill_all()
    assert launched.stdout == PAYLOAD
    assert len(lines_matching(launched.stderr, r"cannot write system/n/")) == 1, launched.stderr
    assert len(lines_matching(launched.stderr, "works again")) == 1, launched.stderr
    node = node_record(run, "n")
    times = snapshot_times(run, "n")
    assert node["status"] == "finished" and node["samples_dropped"] == 0
    assert node["samples_written"] == len(times)  # everything held in memory while full was written later
    span_ticks = (times[-1] - times[0]) / 100_000
    assert len(times) >= span_ticks - node["ticks_missed"], (len(times), span_ticks)  # no hole while it was full


# -- (b) NVML fails in the middle of the run ----------------------------------------------------------------
def _fake_gpu_env(**settings: str) -> dict[str, str]:
    env = {"PYTHONPATH": pythonpath_with(FAKE_PYNVML_DIR), "FAKE_NVML_GPUS": "2"}
    env.update({f"FAKE_NVML_{k.upper()}": v for k, v in settings.items()})
    return env


def test_fake_gpus_are_sampled_end_to_end(tmp_path):
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--node", "g", "--",
                   *job(tmp_path, "time.sleep(0.8)", exit_code=0), env=_fake_gpu_env())
    assert p.returncode == 0, p.stderr
    node = node_record(run, "g")
    assert [d["name"] for d in node["gpus"]] == ["Fake GPU 0", "Fake GPU 1"] and node["gpu_driver"] == "999.99.99"
    times = snapshot_times(run, "g")
    assert len(times) >= 4
    assert set(series(run, "g", "gpu1", r.GPU_POWER_W).values()) == {151.0}
    assert set(series(run, "g", "gpu0", r.GPU_MEM_UTIL).values()) == {25.0}
    assert len(series(run, "g", "gpu0", r.GPU_UTIL)) == len(times)


def test_gpu_lost_mid_run(tmp_path):
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--node", "g", "--",
                   *job(tmp_path, "time.sleep(2)", exit_code=4),
                   env=_fake_gpu_env(fail_after="5", fail_with="GpuIsLost", fail_gpus="1"))
    assert p.returncode == 4, p.stderr
    assert p.stdout == PAYLOAD
    times = snapshot_times(run, "g")
    assert len(times) >= 10
    gpu0 = series(run, "g", "gpu0", r.GPU_UTIL)
    gpu1 = series(run, "g", "gpu1", r.GPU_UTIL)
    assert sorted(gpu0) == times  # the other GPU goes on
    assert sorted(gpu1) == times[:5]  # the lost one: its first five reads, then nothing
    assert sorted(series(run, "g", r.CPU, r.CPU_UTIL)) == times  # and so does everything else
    said = lines_matching(p.stderr, "GPU 1")
    assert len(said) == 1 and "GpuIsLost" in said[0], p.stderr


def test_nvml_errors_mid_run_leave_gaps_and_one_line(tmp_path):
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--node", "g", "--",
                   *job(tmp_path, "time.sleep(2)", exit_code=0),
                   env=_fake_gpu_env(fail_after="5", fail_count="5", fail_with="Unknown"))
    assert p.returncode == 0, p.stderr
    assert p.stdout == PAYLOAD
    times = snapshot_times(run, "g")
    assert len(times) >= 12
    for gpu in ("gpu0", "gpu1"):
        have = sorted(series(run, "g", gpu, r.GPU_TEMP_C))
        assert have == times[:5] + times[10:], gpu  # reads 6-10 failed, then it came back
    said = lines_matching(p.stderr, "NVMLError_Unknown")
    assert len(said) == 1, p.stderr


# -- (c) the sampler process is killed ----------------------------------------------------------------------
def _running_sampler_pid(run: Path, node: str) -> int:
    rec = wait_until(lambda: (lambda d: d if d and d.get("status") == "running" else None)(
        read_json(run / "nodes" / f"{node}.json")), 30, what="the sampler to start")
    return int(rec["sampler_pid"])


def test_sampler_killed_is_restarted_and_data_keeps_coming(tmp_path):
    run = tmp_path / "run"
    bg = Background(tmp_path, "run", "--report", "off",
                    "--interval", "100ms", "--flush-interval", "0.5", "--out", str(run),
                    "--node", "n", "--", *job(tmp_path, "time.sleep(4)", exit_code=7))
    try:
        pid = _running_sampler_pid(run, "n")
        sampler = psutil.Process(pid)
        assert SAMPLER_MODULE in sampler.cmdline() and sampler.ppid() == bg.proc.pid
        time.sleep(1.0)
        kill_us = now_us()
        sampler.kill()
        code = bg.wait(timeout=60)
    finally:
        bg.kill_all()
    assert code == 7, bg.stderr
    assert bg.stdout == PAYLOAD
    assert len(lines_matching(bg.stderr, r"sampler exited .*restarting it \(1 of 3\)")) == 1, bg.stderr
    node = node_record(run, "n")
    assert node["sampler_pid"] != pid and node["status"] == "finished" and node["exit_code"] == 7
    times = snapshot_times(run, "n")
    before = [t for t in times if t < kill_us]
    after = [t for t in times if t > kill_us]
    gap = (after[0] - before[-1]) / 1e6 if before and after else None
    report("sampler SIGKILL", snapshots_before=len(before), snapshots_after=len(after), gap_s=gap)
    assert len(before) >= 3  # flushed parts of the killed sampler survive
    assert len(after) >= 10  # ~2.5 s of the job left after the restart, at 100 ms
    assert gap is not None and gap < 8, gap  # lost: the unflushed 0.5 s + the restart


# -- (d) the config file is invalid -------------------------------------------------------------------------
@pytest.mark.parametrize("content, field", [
    ('{"sample_interval_ms": 200,', "config file"),  # not JSON
    ('{"sample_interval_ms": 5}', "sample_interval_ms"),  # a value out of range
    ('{"sample_intervall_ms": 200}', "sample_intervall_ms"),  # a typo
    ('{"flush_interval_s": 0.05}', "flush_interval_s"),  # below 0.2 s
])
def test_invalid_config_file_still_runs_the_command(tmp_path, content, field):
    cfg = tmp_path / "stallwatch.json"
    cfg.write_text(content)
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off",
                   "--config", str(cfg), "--interval", "1s", "--out", str(run), "--node", "n",
                   "--", *job(tmp_path, "time.sleep(1.2)", exit_code=3))
    assert p.returncode == 3, p.stderr
    assert p.stdout == PAYLOAD
    errors = lines_matching(p.stderr, r"invalid ")
    assert len(errors) == 1, p.stderr
    assert field in errors[0] and "default configuration" in errors[0]
    node = node_record(run, "n")
    assert node["sample_interval_ms"] == 1000  # the flags still apply
    assert node["exit_code"] == 3
    assert json.loads((run / "config.json").read_text())["flush_interval_s"] == 5.0  # the defaults


@pytest.mark.parametrize("content, field", [
    (b'{"sample_interval_ms": ' + b"9" * 5000 + b"}", "sample_interval_ms"),  # ValueError in json
    (b'{"out": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "config file"),  # RecursionError
    (b'{"node": "\xff\xfe"}', "config file"),  # UnicodeDecodeError
    (b'{"max_storage_mb": 1e308}', "max_storage_mb"),  # OverflowError in the sampler
    ("/dev/zero", "config file"),  # read forever
    ("fifo", "config file"),  # blocked in open()
], ids=["huge-int", "deep", "invalid-utf8", "1e308", "dev-zero", "fifo"])
def test_a_hostile_config_file_still_runs_the_command_with_the_defaults(tmp_path, content, field):
    """What the README promises for any bad config file: one line naming the field, the value and what is
    allowed; the job runs with the defaults. Each of these tracebacked or hung before."""
    if content == "/dev/zero":
        cfg = Path("/dev/zero")
    elif content == "fifo":
        cfg = tmp_path / "stallwatch.json"
        os.mkfifo(cfg)
    else:
        cfg = tmp_path / "stallwatch.json"
        cfg.write_bytes(content)
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off",
                   "--config", str(cfg), "--interval", "1s", "--out", str(run), "--node", "n",
                   "--rules-interval", "0", "--", *job(tmp_path, "time.sleep(0.5)", exit_code=3), timeout=60)
    assert p.returncode == 3, p.stderr
    assert p.stdout == PAYLOAD
    assert "Traceback" not in p.stderr, p.stderr
    errors = lines_matching(p.stderr, r"invalid ")
    assert len(errors) == 1, p.stderr
    assert field in errors[0] and "default configuration" in errors[0] and len(errors[0]) < 400, errors[0]
    assert node_record(run, "n")["exit_code"] == 3
    assert json.loads((run / "config.json").read_text())["max_storage_mb"] == 10240  # the defaults


@pytest.mark.parametrize("with_file", [False, True])
def test_invalid_flag_is_a_usage_error(tmp_path, with_file):
    marker = tmp_path / "ran"
    cfg = tmp_path / "ok.json"
    cfg.write_text('{"flush_interval_s": 2}')
    p = stallwatch(tmp_path, "run", "--report", "off",
                   *(["--config", str(cfg)] if with_file else []), "--interval", "5ms",
                   "--out", str(tmp_path / "run"), "--", "touch", str(marker))
    assert p.returncode == 2
    errors = lines_matching(p.stderr, "invalid")
    assert len(errors) == 1 and "sample_interval_ms" in errors[0], p.stderr
    assert not marker.exists()
    assert not (tmp_path / "run").exists()


# -- (e) the command is SIGKILLed mid-run -------------------------------------------------------------------
def test_command_killed_mid_run(tmp_path):
    run = tmp_path / "run"
    p = stallwatch(tmp_path, "run", "--report", "off",
                   "--interval", "100ms", "--flush-interval", "1", "--out", str(run),
                   "--node", "n", "--", *job(tmp_path, "time.sleep(2)\nos.kill(os.getpid(), signal.SIGKILL)"))
    assert p.returncode == 137, p.stderr
    assert p.stdout == PAYLOAD
    node = node_record(run, "n")
    assert node["status"] == "finished" and node["exit_code"] == 137
    times = snapshot_times(run, "n")
    expected = (node["end_us"] - times[0]) / 100_000 + 1 - node["ticks_missed"]
    lost = expected - len(times)
    report("command SIGKILL", stored=len(times), expected_from_elapsed=round(expected, 1), lost=round(lost, 1),
           flush_interval_samples=10, ticks_missed=node["ticks_missed"])
    assert lost <= 10, (len(times), expected)  # at most one flush interval (1 s at 100 ms)
    assert node["samples_written"] == len(times)
    assert times[-1] >= node["end_us"] - 1_000_000


# -- (f) the launcher itself is SIGKILLed -------------------------------------------------------------------
def test_launcher_killed_sampler_flushes_and_exits(tmp_path):
    run = tmp_path / "run"
    body = f"open({str(tmp_path / 'job.pid')!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)"
    bg = Background(tmp_path, "run", "--report", "off",
                    "--interval", "100ms", "--flush-interval", "1", "--out", str(run),
                    "--node", "n", "--", *job(tmp_path, body))
    job_pid = None
    try:
        pid = _running_sampler_pid(run, "n")
        sampler = psutil.Process(pid)
        job_pid = int(wait_until(lambda: (tmp_path / "job.pid").exists() and (tmp_path / "job.pid").read_text(), 30))
        time.sleep(2.5)
        kill_us = now_us()
        bg.proc.kill()
        bg.proc.wait(timeout=30)
        t0 = time.monotonic()
        try:
            status = sampler.wait(timeout=15)
        except psutil.TimeoutExpired:
            pytest.fail("the sampler is still running 15 s after its launcher was killed")
        exit_s = time.monotonic() - t0
        job_gone = not psutil.pid_exists(job_pid) or psutil.Process(job_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        bg.kill_all()
        if job_pid:
            try:
                os.kill(job_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert status in (0, None)  # None: not our child, its exit status is not ours to see
    node = node_record(run, "n")
    # The job died with its launcher (the sampler killed it: docs/reliability.md), and its end is recorded as such
    assert node["status"] == "finished" and node["exit_code"] == 137 and node["exit_signal"] == "SIGKILL", node
    assert job_gone
    finished_s = (node["sampler_end_us"] - kill_us) / 1e6  # its own clock: EOF seen, flushed, record written
    times = snapshot_times(run, "n")
    expected = (kill_us - times[0]) / 100_000 + 1 - node["ticks_missed"]
    lost = expected - len([t for t in times if t <= kill_us])
    report("launcher SIGKILL", sampler_done_after_s=round(finished_s, 3), gone_after_s=round(exit_s, 2),
           stored=len(times), lost_before_kill=round(lost, 1), last_vs_kill_s=round((times[-1] - kill_us) / 1e6, 3),
           flush_interval_samples=10)
    assert 0 <= finished_s < 5, finished_s
    assert times[-1] >= kill_us - 1_000_000 - 100_000  # covers up to the kill, less at most one flush interval
    assert lost <= 10
    assert node["samples_written"] == len(times)


# -- (g) a normal exit loses nothing ------------------------------------------------------------------------
def test_normal_exit_stores_every_snapshot(tmp_path):
    run = tmp_path / "run"
    body = f"open({str(tmp_path / 'job.start')!r}, 'w').write(str(time.time_ns() // 1000))\ntime.sleep(2)\n" \
           f"open({str(tmp_path / 'job.end')!r}, 'w').write(str(time.time_ns() // 1000))"
    p = stallwatch(tmp_path, "run", "--report", "off",
                   "--interval", "100ms", "--flush-interval", "0.5", "--out", str(run),
                   "--node", "n", "--", *job(tmp_path, body, exit_code=0))
    assert p.returncode == 0, p.stderr
    node = node_record(run, "n")
    times = snapshot_times(run, "n")
    assert node["samples_dropped"] == 0
    assert node["samples_written"] == len(times)  # every snapshot taken is stored, once
    # every row of a snapshot is there: the host metrics are never missing
    assert sorted(series(run, "n", r.MEMORY, r.MEM_USED_BYTES)) == times
    job_start = int((tmp_path / "job.start").read_text())
    job_end = int((tmp_path / "job.end").read_text())
    # sampling starts with the job: the job no longer waits for the sampler (its start-up, ~0.3 s, more on a
    # loaded machine, runs beside the job's own), so the first snapshot comes within that start-up
    assert times[0] <= job_start + 1_500_000, (times[0] - job_start)
    # and covers its end: a last partial interval shorter than half an interval gets no snapshot of its own
    assert times[-1] >= job_end - 100_000, (times[-1] - job_end)
    span_ticks = (times[-1] - times[0]) / 100_000
    report("normal exit", stored=len(times), span_ticks=round(span_ticks, 1), ticks_missed=node["ticks_missed"])
    assert len(times) >= span_ticks - node["ticks_missed"]  # one per tick, the final one included
    # only whole segments are left: the parts were compacted
    assert [f.name.split("-")[0] for f in (run / "system" / "n").iterdir()] == ["seg"]
