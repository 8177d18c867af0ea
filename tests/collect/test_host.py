"""Host readings: which disks and NICs count, and HostReader on the real machine."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stallwatch import records as r
from stallwatch.collect.host import HostReader, _rate, physical_disks, physical_nics


# -- disk and NIC filters, on directories shaped like /sys/block and /sys/class/net --------------------------
def make_sys_block(root: Path, names: list[str]) -> str:
    for n in names:
        (root / n).mkdir(parents=True)
        (root / n / "stat").write_text("0 0 0 0 0 0 0 0 0 0 0\n")
    return str(root)


def test_physical_disks_keeps_whole_physical_disks_only(tmp_path):
    sys_block = make_sys_block(tmp_path / "block", [
        "sda", "sdb", "nvme0n1", "vda", "xvda", "mmcblk0",  # whole physical disks
        "loop0", "loop7", "ram0", "zram0", "dm-0", "dm-12", "md0", "md127", "sr0", "fd0", "nbd3",  # virtual
    ])
    names = ["sda", "sda1", "sda2", "sdb", "nvme0n1", "nvme0n1p1", "nvme0n1p2", "vda", "vda1", "xvda",
             "mmcblk0", "mmcblk0p1", "loop0", "loop7", "ram0", "zram0", "dm-0", "dm-12", "md0", "md127",
             "sr0", "fd0", "nbd3"]
    assert physical_disks(names, sys_block) == ["sda", "sdb", "nvme0n1", "vda", "xvda", "mmcblk0"]


def test_physical_disks_partitions_are_never_counted_twice(tmp_path):
    # psutil lists partitions next to their disk; /sys/block only has the disk: the sum counts bytes once.
    sys_block = make_sys_block(tmp_path / "block", ["nvme1n1"])
    assert physical_disks(["nvme1n1p1", "nvme1n1", "nvme1n1p2"], sys_block) == ["nvme1n1"]
    assert physical_disks([], sys_block) == []
    assert physical_disks(["sda"], str(tmp_path / "no-such-dir")) == []


def make_sys_net(root: Path, with_device: list[str], virtual: list[str]) -> str:
    devices = root / "devices"
    for n in with_device:
        (root / "net" / n).mkdir(parents=True)
        target = devices / f"pci0000:00/{n}"
        target.mkdir(parents=True)
        os.symlink(target, root / "net" / n / "device")  # as in sysfs: a link to the bus device
    for n in virtual:
        (root / "net" / n).mkdir(parents=True)
    return str(root / "net")


def test_physical_nics_on_a_host_leaves_out_virtual_ones(tmp_path):
    sys_net = make_sys_net(tmp_path, ["eth0", "enp5s0", "ib0"], ["lo", "docker0", "veth1a2b", "br-x", "bond0"])
    names = ["lo", "eth0", "docker0", "veth1a2b", "enp5s0", "br-x", "ib0", "bond0"]
    assert physical_nics(names, sys_net) == ["eth0", "enp5s0", "ib0"]


def test_physical_nics_in_a_container_takes_every_nic_but_loopback(tmp_path):
    sys_net = make_sys_net(tmp_path, [], ["lo", "eth0", "eth1"])
    assert physical_nics(["lo", "eth0", "eth1"], sys_net) == ["eth0", "eth1"]
    assert physical_nics(["lo"], sys_net) == []


def test_this_machine_disks_and_nics_are_a_subset_of_psutil():
    disks = list(psutil.disk_io_counters(perdisk=True) or {})
    nics = list(psutil.net_io_counters(pernic=True) or {})
    assert set(physical_disks(disks)) <= set(disks)
    assert "lo" not in physical_nics(nics)


# -- HostReader on this machine ----------------------------------------------------------------------------
def test_keys_and_values_line_up():
    reader = HostReader()
    keys = reader.keys()
    assert len(keys) == len(set(keys))
    assert reader.cores == len(psutil.cpu_times(percpu=True))
    assert keys[:2] == [r.MetricKey(r.CPU, r.CPU_UTIL), r.MetricKey(r.CPU, r.CPU_IOWAIT)]
    assert [k.device for k in keys[2:2 + 2 * reader.cores:2]] == [f"cpu{i}" for i in range(reader.cores)]
    for metric in (r.MEM_UTIL, r.MEM_USED_BYTES, r.DISK_READ_BPS, r.DISK_WRITE_BPS, r.NET_RX_BPS, r.NET_TX_BPS):
        assert metric in {k.metric for k in keys}
    time.sleep(0.2)
    values = reader.read()
    assert len(values) == len(keys)
    v = dict(zip(keys, values))
    for key, value in v.items():
        assert isinstance(value, float), key
        if key.metric in (r.CPU_UTIL, r.CPU_IOWAIT, r.MEM_UTIL):
            assert 0.0 <= value <= 100.0, (key, value)
        else:
            assert value >= 0.0, (key, value)
    vm = psutil.virtual_memory()
    assert v[r.MetricKey(r.MEMORY, r.MEM_UTIL)] == pytest.approx(vm.percent, abs=5)
    used = v[r.MetricKey(r.MEMORY, r.MEM_USED_BYTES)]
    assert 0 < used < vm.total


def test_many_reads_stay_in_range():
    reader = HostReader()
    for _ in range(10):
        time.sleep(0.02)
        for key, value in zip(reader.keys(), reader.read()):
            if key.metric in (r.CPU_UTIL, r.CPU_IOWAIT):
                assert math.isnan(value) or 0.0 <= value <= 100.0, (key, value)


# A CPU-time budget, not a wall-clock one: on a loaded machine a 1 s busy loop may get almost no CPU.
BUSY = "import time\nend = time.monotonic() + 60\nwhile time.process_time() < {s} and time.monotonic() < end:\n    pass\n"


def test_a_busy_process_raises_cpu_util():
    reader = HostReader()
    t0 = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.5)])
    try:
        ps = psutil.Process(child.pid)
        cpu_s = 0.0
        while child.poll() is None:
            try:
                t = ps.cpu_times()
                cpu_s = t.user + t.system
            except psutil.Error:
                break
            time.sleep(0.05)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    dt = time.monotonic() - t0
    values = dict(zip(reader.keys(), reader.read()))
    per_core = [values[r.MetricKey(f"cpu{i}", r.CPU_UTIL)] for i in range(reader.cores)]
    assert cpu_s > 0.2, "the busy loop got almost no CPU"
    # The machine's busy time over the interval includes at least the busy loop's CPU time (other
    # processes only add to it), so this holds however loaded the machine is.
    busy_core_seconds = sum(per_core) / 100.0 * dt
    assert busy_core_seconds >= 0.8 * cpu_s, (per_core, cpu_s, dt)
    assert max(per_core) >= 0.8 * 100.0 * cpu_s / (dt * reader.cores), (per_core, cpu_s, dt)
    total = values[r.MetricKey(r.CPU, r.CPU_UTIL)]
    assert total == pytest.approx(sum(per_core) / reader.cores, abs=2.0)


def test_disk_writes_show_up_as_write_throughput(tmp_path):
    reader = HostReader()
    if not reader._disks:
        pytest.skip("no physical disk visible in /sys/block on this machine")
    size = 16 << 20
    t0 = time.monotonic()
    with open(tmp_path / "blob", "wb") as fh:
        fh.write(os.urandom(size))
        fh.flush()
        os.fsync(fh.fileno())
    dt = time.monotonic() - t0
    values = dict(zip(reader.keys(), reader.read()))
    written = values[r.MetricKey(r.DISK, r.DISK_WRITE_BPS)] * dt
    if os.stat(tmp_path).st_dev not in _physical_devs(reader._disks):
        pytest.skip(f"{tmp_path} is not on one of {reader._disks}")
    assert written >= 0.5 * size, (written, size, dt)


def _physical_devs(disks: list[str]) -> set[int]:
    devs = set()
    for d in disks:
        for p in Path(f"/sys/block/{d}").glob("**/dev"):
            try:
                major, minor = p.read_text().strip().split(":")
            except (OSError, ValueError):
                continue
            devs.add(os.makedev(int(major), int(minor)))
    return devs


def test_rate_refuses_counters_that_went_backwards():
    assert _rate(1000.0, 0.5) == 2000.0
    assert math.isnan(_rate(-5.0, 0.5))  # a wrapped or reset counter is no value, not a spike
    assert math.isnan(_rate(10.0, 0.0))


@pytest.mark.parametrize("use_procfs", [True, False], ids=["procfs", "psutil"])
def test_a_core_going_offline_blanks_cpu_for_that_interval(monkeypatch, use_procfs):
    """Whichever source the reader uses, one row fewer than at start gives no CPU values, not wrong ones."""
    from stallwatch.collect import procfs

    if use_procfs and not procfs.AVAILABLE:
        pytest.skip("Linux /proc only")
    reader = HostReader(use_procfs=use_procfs)
    time.sleep(0.05)
    if use_procfs:
        real_rows = procfs.cpu_rows
        monkeypatch.setattr(procfs, "cpu_rows", lambda source=None: real_rows(source)[:-1])
    else:
        real = psutil.cpu_times

        def fewer(percpu=False):
            times = real(percpu=percpu)
            return times[:-1] if percpu else times

        monkeypatch.setattr(psutil, "cpu_times", fewer)
    time.sleep(0.05)  # ticks pass, so a reader that ignored the missing core would report real numbers
    values = dict(zip(reader.keys(), reader.read()))
    assert math.isnan(values[r.MetricKey(r.CPU, r.CPU_UTIL)])
    assert math.isnan(values[r.MetricKey("cpu0", r.CPU_UTIL)])
    assert values[r.MetricKey(r.MEMORY, r.MEM_USED_BYTES)] > 0  # the rest of the snapshot is still there


def test_nic_speeds_read_the_kernels_link_speed_and_say_unknown_otherwise(tmp_path):
    """/sys/class/net/<nic>/speed in Mb/s; a virtual NIC (the file unreadable) or a link that is down (-1): None."""
    from stallwatch.collect.host import nic_speeds

    for name, speed in (("eth0", "25000\n"), ("eth1", "-1\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "speed").write_text(speed)
    (tmp_path / "veth0").mkdir()
    assert nic_speeds(["eth0", "eth1", "veth0"], sys_net=str(tmp_path)) == [
        {"name": "eth0", "speed_mbps": 25000}, {"name": "eth1", "speed_mbps": None},
        {"name": "veth0", "speed_mbps": None}]
