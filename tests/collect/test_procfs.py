"""The /proc fast path must read the same numbers psutil does (psutil stays the reference)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from stallwatch.collect import procfs
from stallwatch.collect.host import HostReader, physical_disks, physical_nics

pytestmark = pytest.mark.skipif(not procfs.AVAILABLE, reason="Linux /proc only")


def test_cpu_rows_match_psutil_per_core() -> None:
    ours = procfs.cpu_rows()
    theirs = psutil.cpu_times(percpu=True)
    assert len(ours) == len(theirs) == psutil.cpu_count()
    for (total, idle, iowait), t in zip(ours, theirs):
        # Same counters, ours in ticks; a few ticks pass between the two reads.
        assert idle / procfs.CLOCK_TICKS == pytest.approx(t.idle + t.iowait, abs=0.5)
        assert iowait / procfs.CLOCK_TICKS == pytest.approx(t.iowait, abs=0.5)
        psutil_total = t.user + t.nice + t.system + t.idle + t.iowait + t.irq + t.softirq + t.steal
        assert total / procfs.CLOCK_TICKS == pytest.approx(psutil_total, abs=0.5)


class _Text:
    """A /proc/stat of another machine, served as a kept-open file would."""

    def __init__(self, text: bytes) -> None:
        self.text = text

    def read(self) -> bytes:
        return self.text


@pytest.mark.parametrize("cores, fields", [(96, 10), (3, 10), (2, 7), (1, 4), (192, 8)])
def test_cpu_rows_of_any_machine_equal_a_line_by_line_reading(cores, fields) -> None:
    """Many cores, newer and older kernels' field counts: (total, idle + iowait, iowait) of the first 8 fields."""
    rng = np.random.default_rng(cores)
    lines = [b"cpu  " + b" ".join(b"%d" % v for v in rng.integers(0, 10**9, fields))]
    table = rng.integers(0, 10**9, (cores, fields))
    lines += [b"cpu%d " % i + b" ".join(b"%d" % v for v in row) for i, row in enumerate(table)]
    lines += [b"intr 1 2 3", b"ctxt 4", b""]
    got = [list(row) for row in procfs.cpu_rows(_Text(b"\n".join(lines)))]
    padded = np.pad(table[:, :8], ((0, 0), (0, max(0, 8 - fields))))
    assert got == [[int(r.sum()), int(r[3] + r[4]), int(r[4])] for r in padded]


def test_cpu_rows_of_uneven_lines_are_each_read_whole() -> None:
    text = b"cpu  1 2 3 4\ncpu0 1 2 3 4 5\ncpu1 5 6 7 8\nintr 5\n"
    assert [list(row) for row in procfs.cpu_rows(_Text(text))] == [[15, 9, 5], [26, 8, 0]]
    assert len(procfs.cpu_rows(_Text(b"cpu 1 2\nintr 4\n"))) == 0


def test_memory_matches_psutil() -> None:
    total, available = procfs.memory()
    vm = psutil.virtual_memory()
    assert total == vm.total
    assert available == pytest.approx(vm.available, rel=0.02)


def test_disk_and_net_counters_match_psutil() -> None:
    per_disk = psutil.disk_io_counters(perdisk=True, nowrap=False)
    disks = physical_disks(list(per_disk))
    rd, wr = procfs.disk_bytes(frozenset(d.encode() for d in disks))
    per_disk = psutil.disk_io_counters(perdisk=True, nowrap=False)
    # psutil multiplies by the device's sector size, the kernel counts 512-byte units: equal on 512 B disks.
    assert rd == pytest.approx(sum(per_disk[d].read_bytes for d in disks), rel=0.01, abs=1 << 20)
    assert wr == pytest.approx(sum(per_disk[d].write_bytes for d in disks), rel=0.01, abs=1 << 20)
    per_nic = psutil.net_io_counters(pernic=True, nowrap=False)
    nics = physical_nics(list(per_nic))
    rx, tx = procfs.net_bytes(frozenset(n.encode() for n in nics))
    per_nic = psutil.net_io_counters(pernic=True, nowrap=False)
    assert rx == pytest.approx(sum(per_nic[n].bytes_recv for n in nics), abs=1 << 16)
    assert tx == pytest.approx(sum(per_nic[n].bytes_sent for n in nics), abs=1 << 16)


def test_process_cpu_and_rss_match_psutil() -> None:
    """A busy child with a recognisable RSS: ours and psutil's readings of it agree."""
    code = "x = bytearray(64 << 20)\nimport time\nt = time.time()\nwhile time.time() - t < 30: pass\n"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        proc = psutil.Process(child.pid)
        while proc.memory_info().rss < 64 << 20:
            pass
        cpu, rss = procfs.process(child.pid)
        t, mem = proc.cpu_times(), proc.memory_info()
        assert cpu == pytest.approx(t.user + t.system, abs=0.1)
        assert rss == pytest.approx(mem.rss, rel=0.05)
    finally:
        child.kill()
        child.wait()
    assert procfs.process(child.pid) is None  # reaped: gone


def test_a_zombie_reads_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        pass
    try:
        assert procfs.process(child.pid) is None
    finally:
        child.wait()


def test_command_names_with_parentheses_and_spaces_parse() -> None:
    """/proc/<pid>/stat wraps the name in parentheses; a name like 'a) (b' must not shift the fields."""
    code = "open('/proc/self/comm', 'w').write('we) (ird'); print('ok', flush=True); import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ok"
    try:
        assert psutil.Process(child.pid).name() == "we) (ird"
        reading = procfs.process(child.pid)
        assert reading is not None and reading[1] > 1 << 20
    finally:
        child.kill()
        child.wait()


def test_host_reader_agrees_with_its_psutil_fallback() -> None:
    fast, slow = HostReader(), HostReader(use_procfs=False)
    assert [k.column for k in fast.keys()] == [k.column for k in slow.keys()]
    a, b = fast.read(), slow.read()
    mem = [k.column for k in fast.keys()].index("memory/mem_used_bytes")
    assert a[mem] == pytest.approx(b[mem], rel=0.05)


def test_a_kept_open_file_reads_fresh_and_whole_content_each_time(monkeypatch) -> None:
    """The kernel writes a /proc file anew for each read from its start; seq files give a page or so per
    read, so a file longer than one read comes back whole, and a counter read twice has moved."""
    monkeypatch.setattr(procfs, "CHUNK", 64)  # every file is many reads long
    meminfo = procfs.ProcFile(procfs.MEMINFO)
    stat = procfs.ProcFile("/proc/self/stat")
    try:
        text = meminfo.read()
        assert text.split(b"\n")[0].startswith(b"MemTotal:") and len(text) > 10 * 64
        assert [ln.split(b":")[0] for ln in text.split(b"\n")] == [
            ln.split(b":")[0] for ln in procfs._read(procfs.MEMINFO).split(b"\n")]
        before = procfs.process(os.getpid(), stat)
        t = time.thread_time()
        while time.thread_time() - t < 0.05:
            pass
        after = procfs.process(os.getpid(), stat)
        assert before is not None and after is not None and after[0] > before[0]
        assert procfs.memory(meminfo) == pytest.approx(procfs.memory(), rel=0.05)
    finally:
        meminfo.close()
        stat.close()


@pytest.mark.parametrize("path", [procfs.STAT, procfs.MEMINFO, "/proc/self/stat"])
def test_a_file_made_as_one_record_is_read_in_one_system_call_and_whole(monkeypatch, path) -> None:
    """/proc/stat, /proc/meminfo and /proc/<pid>/stat are made whole at each read: a read shorter than asked is
    the end (no second read per file per snapshot); one longer than a read still comes back whole."""
    calls = []
    real = os.pread
    monkeypatch.setattr(procfs.os, "pread", lambda fd, n, off: calls.append(off) or real(fd, n, off))
    source = procfs.ProcFile(path, one_record=True)
    try:
        text = source.read()
        assert calls == [0] and text.count(b"\n") >= 1
        monkeypatch.setattr(procfs, "CHUNK", 64)  # now longer than one read
        calls.clear()
        long = source.read()
        assert len(calls) > 2 and long.split(b"\n")[0].split()[:1] == text.split(b"\n")[0].split()[:1]
        assert abs(len(long) - len(text)) < 64  # the same file, read again (its counters moved)
    finally:
        source.close()


def test_a_kept_open_process_file_reads_as_gone_once_the_process_exits() -> None:
    """Even when its pid is reused, the open file names the process that ended: it never reads another."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    source = procfs.ProcFile(f"/proc/{child.pid}/stat")
    try:
        assert procfs.process(child.pid, source) is not None
        child.kill()
        child.wait()
        assert procfs.process(child.pid, source) is None
    finally:
        source.close()
