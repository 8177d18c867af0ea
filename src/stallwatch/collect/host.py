"""CPU, memory, disk and network readings of one machine, as rates over the sampling interval."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import psutil

from stallwatch.collect import procfs

from stallwatch import records as r
from stallwatch.records import MetricKey

# Whole-disk names that sit on top of other disks (or in RAM): summing them would count I/O twice.
_VIRTUAL_DISK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")
_NAN = math.nan


def physical_disks(names: list[str], sys_block: str = "/sys/block") -> list[str]:
    """Whole physical disks among psutil's per-disk names (partitions and virtual devices left out)."""
    return [n for n in names if os.path.exists(os.path.join(sys_block, n)) and not n.startswith(_VIRTUAL_DISK_PREFIXES)]


def physical_nics(names: list[str], sys_net: str = "/sys/class/net") -> list[str]:
    """NICs backed by a device; inside a container (only virtual NICs) every NIC but loopback."""
    real = [n for n in names if os.path.exists(os.path.join(sys_net, n, "device"))]
    return real or [n for n in names if n != "lo"]


def nic_speeds(names: list[str], sys_net: str = "/sys/class/net") -> list[dict[str, object]]:
    """Each NIC's link speed in Mb/s as the kernel reports it (`/sys/class/net/<nic>/speed`); None where it cannot
    say (a virtual NIC, a link that is down): what the communication rule compares its bandwidth with."""
    out: list[dict[str, object]] = []
    for name in names[:64]:
        try:
            with open(os.path.join(sys_net, name, "speed")) as f:
                speed: int | None = int(f.read().strip())
        except (OSError, ValueError):
            speed = None
        out.append({"name": name, "speed_mbps": speed if speed is not None and speed > 0 else None})
    return out


CpuRows = list[tuple[float, float, float]]  # per core: cumulative (total, idle incl. iowait, iowait)


@dataclass
class _Counters:
    mono_s: float
    cpu: CpuRows
    disk_read: float
    disk_write: float
    net_rx: float
    net_tx: float
    mem_total: float
    mem_available: float


def _psutil_cpu_rows() -> CpuRows:
    rows = []
    for t in psutil.cpu_times(percpu=True):
        d = t._asdict()
        total = sum(v for k, v in d.items() if k not in ("guest", "guest_nice"))
        iowait = d.get("iowait", 0.0)
        rows.append((total, d["idle"] + iowait, iowait))
    return rows


class HostReader:
    """Reads the machine's counters once per snapshot and turns them into percentages and bytes/s.
    On Linux the counters come straight from /proc (procfs.py); elsewhere through psutil."""

    def __init__(self, use_procfs: bool | None = None) -> None:
        self._procfs = procfs.AVAILABLE if use_procfs is None else use_procfs
        self._files = {path: procfs.ProcFile(path, one_record=path in procfs.ONE_RECORD)
                       for path in (procfs.STAT, procfs.MEMINFO, procfs.DISKSTATS, procfs.NET_DEV)}
        # The rows the counters have (online cores), so the per-core columns match what is read each time.
        self.cores = len(self._cpu_rows()) or psutil.cpu_count(logical=True) or 1
        disks = psutil.disk_io_counters(perdisk=True, nowrap=False) or {}
        self._disks = physical_disks(list(disks))
        self._disk_set = frozenset(d.encode() for d in self._disks)
        nics = psutil.net_io_counters(pernic=True, nowrap=False) or {}
        self._nics = physical_nics(list(nics))
        self.nics = list(self._nics)  # the NICs whose traffic is summed (their link speeds go in the node record)
        self._nic_set = frozenset(n.encode() for n in self._nics)
        self._prev = self._read()

    def keys(self) -> list[MetricKey]:
        keys = [MetricKey(r.CPU, r.CPU_UTIL), MetricKey(r.CPU, r.CPU_IOWAIT)]
        for i in range(self.cores):
            keys += [MetricKey(f"cpu{i}", r.CPU_UTIL), MetricKey(f"cpu{i}", r.CPU_IOWAIT)]
        keys += [
            MetricKey(r.MEMORY, r.MEM_UTIL), MetricKey(r.MEMORY, r.MEM_USED_BYTES),
            MetricKey(r.DISK, r.DISK_READ_BPS), MetricKey(r.DISK, r.DISK_WRITE_BPS),
            MetricKey(r.NET, r.NET_RX_BPS), MetricKey(r.NET, r.NET_TX_BPS),
        ]
        return keys

    def _cpu_rows(self) -> CpuRows:
        return procfs.cpu_rows(self._files[procfs.STAT]) if self._procfs else _psutil_cpu_rows()

    def close(self) -> None:
        for f in self._files.values():
            f.close()

    def _read(self) -> _Counters:
        mono = time.monotonic()
        cpu = self._cpu_rows()
        if self._procfs:
            rd, wr = procfs.disk_bytes(self._disk_set, self._files[procfs.DISKSTATS])
            rx, tx = procfs.net_bytes(self._nic_set, self._files[procfs.NET_DEV])
            mem_total, mem_avail = procfs.memory(self._files[procfs.MEMINFO])
        else:
            disks = psutil.disk_io_counters(perdisk=True, nowrap=False) or {}
            rd = sum(disks[n].read_bytes for n in self._disks if n in disks)
            wr = sum(disks[n].write_bytes for n in self._disks if n in disks)
            nics = psutil.net_io_counters(pernic=True, nowrap=False) or {}
            rx = sum(nics[n].bytes_recv for n in self._nics if n in nics)
            tx = sum(nics[n].bytes_sent for n in self._nics if n in nics)
            vm = psutil.virtual_memory()
            mem_total, mem_avail = vm.total, vm.available
        return _Counters(mono, cpu, rd, wr, rx, tx, mem_total, mem_avail)

    def read(self) -> list[float]:
        """Values in the order of `keys()`, over the time since the previous call."""
        cur = self._read()
        prev, self._prev = self._prev, cur
        dt = cur.mono_s - prev.mono_s
        out: list[float] = []
        if len(cur.cpu) == len(prev.cpu) == self.cores:
            deltas = [(a[0] - b[0], a[1] - b[1], a[2] - b[2]) for a, b in zip(cur.cpu, prev.cpu)]
            total = (sum(d[0] for d in deltas), sum(d[1] for d in deltas), sum(d[2] for d in deltas))
            for d in [total, *deltas]:
                out += _cpu_percentages(*d)
        else:  # a core went offline or came back: no CPU values for this interval
            out = [_NAN] * (2 * (self.cores + 1))
        used = cur.mem_total - cur.mem_available
        out += [100.0 * used / cur.mem_total if cur.mem_total else _NAN, float(used)]
        out += [_rate(cur.disk_read - prev.disk_read, dt), _rate(cur.disk_write - prev.disk_write, dt),
                _rate(cur.net_rx - prev.net_rx, dt), _rate(cur.net_tx - prev.net_tx, dt)]
        return out


def _cpu_percentages(total: float, idle: float, iowait: float) -> tuple[float, float]:
    """(busy %, I/O-wait %) of one interval's counter deltas; no value when no time was counted."""
    if total <= 0:
        return _NAN, _NAN
    return min(100.0, max(0.0, 100.0 * (total - idle) / total)), min(100.0, max(0.0, 100.0 * iowait / total))


def _rate(delta: float, dt: float) -> float:
    """Bytes per second; a counter that went backwards (wrap, device reset) gives no value, not a spike."""
    if dt <= 0 or delta < 0:
        return _NAN
    return delta / dt
