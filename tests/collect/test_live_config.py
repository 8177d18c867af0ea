"""The sampler's watch on a run's config.json: every edit it does not take is refused with one line saying
why, whatever the file holds; the running configuration stays in force. (The whole path, from an edit to
the job's next step, is tested with a real job in tests/torch/test_live_config.py.)"""

from __future__ import annotations

import json
import logging
import os

import pytest

from stallwatch.collect.live_config import ConfigWatcher
from stallwatch.config import ProfilerConfig, ProfilingRange
from stallwatch.store.location import RunLocation


@pytest.fixture
def watched(tmp_path, caplog):
    """A run whose config.json the watcher has read once (as at the job's start); checked by hand."""
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    running = ProfilerConfig(node="n1", out=str(tmp_path / "run"))
    location = RunLocation(str(tmp_path / "run"))
    location.write_atomic("config.json", running.to_json().encode())
    watcher = ConfigWatcher(location, running, poll_s=3600)
    watcher.check()
    yield watcher, location, tmp_path / "run" / "config.json"
    watcher.close()


def _refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "change is refused" in r.getMessage()]


HOSTILE = [
    (b'{"detailed_profiling": "\xff\xfe"}', "not UTF-8"),
    (b'{"sample_interval_ms": ' + b"9" * 5000 + b"}", "sample_interval_ms=<an integer of 5000 digits>"),
    (b'{"detailed_profiling": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "too deeply"),
    (b'{"detailed_profiling": "1:2", "x": "' + b"y" * (2 << 20) + b'"}', "larger than"),
]


@pytest.mark.parametrize("data, words", HOSTILE, ids=["invalid-utf8", "huge-int", "deep", "2-MB"])
def test_an_edit_that_cannot_be_parsed_is_refused_with_a_line(watched, caplog, data, words):
    """These escaped the watcher's validation (UnicodeDecodeError, ValueError, RecursionError) and were
    logged at debug level only: refused without a word."""
    watcher, _, path = watched
    path.write_bytes(data)
    watcher.check()
    (line,) = _refusals(caplog)
    assert words in line and "running configuration stays in force" in line, line
    assert len(line) < 600
    assert watcher.take() is None and watcher.running.detailed_profiling is None


def test_an_edit_of_a_field_fixed_at_start_is_said_to_be_ignored(watched, caplog):
    """Edits of `out`, `node` or `runs_dir` were ignored without a word (other fixed fields were said)."""
    watcher, _, path = watched
    data = json.loads(path.read_text())
    data.update(node="elsewhere", runs_dir="other-runs", detailed_profiling="30:2")
    path.write_text(json.dumps(data))
    watcher.check()
    (line,) = [r.getMessage() for r in caplog.records if "cannot change while the job runs" in r.getMessage()]
    assert "node" in line and "runs_dir" in line
    assert watcher.take().detailed_profiling == ProfilingRange(30, 2)  # the live field is taken
    assert watcher.running.node == "n1"


def test_the_file_as_the_run_started_is_not_an_edit(watched, caplog):
    watcher, _, path = watched
    watcher.check()
    assert watcher.take() is None and not caplog.records


def test_a_config_json_that_is_a_fifo_or_a_link_is_refused_not_waited_on(watched, caplog, tmp_path):
    watcher, _, path = watched
    path.unlink()
    os.mkfifo(path)
    watcher.check()  # returned at once: the FIFO is not opened for reading
    (line,) = _refusals(caplog)
    assert "not a regular file" in line
    path.unlink()
    (tmp_path / "elsewhere.json").write_text('{"detailed_profiling": "1:1"}')
    os.symlink(tmp_path / "elsewhere.json", path)
    watcher.check()
    assert "symbolic link" in _refusals(caplog)[-1]
    assert watcher.take() is None


def test_a_local_file_is_read_only_when_its_version_changed(tmp_path, monkeypatch):
    """The sampler's loop polls a local config.json itself (no thread of its own, which would wake the sampler
    twice as often): a look costs one lstat, and the file is read only after it was rewritten or replaced, or
    when REREAD_S passed."""
    from stallwatch.collect import live_config

    running = ProfilerConfig(node="n1", out=str(tmp_path / "run"))
    location = RunLocation(str(tmp_path / "run"))
    location.write_atomic("config.json", running.to_json().encode())
    reads = []
    real_read = location.read
    monkeypatch.setattr(location, "read", lambda *a, **k: (reads.append(1), real_read(*a, **k))[1])
    watcher = ConfigWatcher(location, running)
    try:
        assert not watcher.background and watcher._thread is None
        watcher.poll()
        watcher.poll()
        watcher.poll()
        assert len(reads) == 1
        data = json.loads((tmp_path / "run" / "config.json").read_text())
        data["detailed_profiling"] = "40:3"
        (tmp_path / "run" / "config.json").write_text(json.dumps(data))  # an edit in place
        watcher.poll()
        assert len(reads) == 2 and watcher.take().detailed_profiling == ProfilingRange(40, 3)
        location.write_atomic("config.json", watcher.running.replace(detailed_profiling=None).to_json().encode())
        watcher.poll()
        assert len(reads) == 3 and watcher.take().detailed_profiling is None
        monkeypatch.setattr(live_config, "REREAD_S", 0.0)
        watcher.poll()
        assert len(reads) == 4  # read again although its version did not change
    finally:
        watcher.close()
    remote = ConfigWatcher(type("Remote", (), {"remote": True, "read": lambda *a: b"{}"})(), running, poll_s=3600)
    try:
        assert remote.background and remote._thread is not None  # S3: its own thread, never the sampler's loop
    finally:
        remote.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="inotify: Linux")
def test_on_linux_the_kernel_says_when_config_json_is_written_and_the_loop_no_longer_looks_every_half_second(
        tmp_path):
    """The sampler's loop waits on the watch's descriptor: an edit (in place, or renamed into place) is read as
    soon as it is written, and looking at the file is left to every REREAD_S (a network file system's writes from
    another machine are not told). Other files of the run's folder do not make it read; nor does a write still in
    progress (only its end)."""
    import select

    from stallwatch.collect import live_config

    running = ProfilerConfig(node="n1", out=str(tmp_path / "run"))
    location = RunLocation(str(tmp_path / "run"))
    location.write_atomic("config.json", running.to_json().encode())
    watcher = ConfigWatcher(location, running)
    reads = []
    real_read = location.read
    location.read = lambda *a, **k: (reads.append(1), real_read(*a, **k))[1]  # type: ignore[method-assign]

    def woken(timeout: float = 2.0) -> list[int]:
        ready, _, _ = select.select(watcher.fds(), [], [], timeout)
        watcher.notified(ready)
        return ready

    try:
        assert watcher.fds() and watcher.poll_s == live_config.REREAD_S
        watcher.poll()
        assert len(reads) == 1 and not woken(0.05)
        location.write_atomic("run.json", b"{}")  # another file of the folder: told, not read
        assert woken() and len(reads) == 1
        path = tmp_path / "run" / "config.json"
        with open(path, "w") as fh:  # an edit in place: nothing until it is closed
            fh.write(running.replace(detailed_profiling=ProfilingRange(40, 3)).to_json()[:10])
            fh.flush()
            assert not woken(0.05) and len(reads) == 1
            fh.write(running.replace(detailed_profiling=ProfilingRange(40, 3)).to_json()[10:])
        assert woken() and len(reads) == 2 and watcher.take().detailed_profiling == ProfilingRange(40, 3)
        location.write_atomic("config.json", running.to_json().encode())  # renamed into place
        assert woken() and len(reads) == 3 and watcher.take().detailed_profiling is None
    finally:
        watcher.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="inotify: Linux")
def test_a_sampler_started_before_its_run_folder_exists_is_still_told_of_edits(tmp_path):
    """`stallwatch.torch.profile()` starts the sampler on a run folder nobody made yet: the watch is set once the
    sampler's first write made it, so the loop is told of edits instead of looking at config.json every 0.5 s."""
    import subprocess
    import sys

    from stallwatch.collect.sampler_process import StartMessage

    run = tmp_path / "not-yet" / "run"
    start = StartMessage(run=str(run), node="n1", sample_interval_ms=500, flush_interval_s=5.0,
                         max_storage_bytes=1 << 30, gpu=False, config=ProfilerConfig(node="n1", out=str(run)).to_dict())
    proc = subprocess.Popen([sys.executable, "-m", "stallwatch.collect.sampler_process"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        proc.stdin.write((start.to_json() + "\n").encode())
        proc.stdin.flush()
        assert b"ready" in proc.stdout.readline()
        links = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        assert "anon_inode:inotify" in links, links
    finally:
        proc.stdin.close()
        proc.wait(30)
