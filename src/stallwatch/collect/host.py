"""CPU, memory, disk and network readings of one machine, as rates over the sampling interval."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import psutil

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


@dataclass
class _Counters:
    mono_s: float
    cpu: np.ndarray  # (cores, fields) cumulative seconds
    disk_read: float
    disk_write: float
    net_rx: float
    net_tx: float


class HostReader:
    """Reads /proc through psutil once per snapshot and turns counters into percentages and bytes/s."""

    def __init__(self) -> None:
        fields = psutil.cpu_times()._fields
        # One matrix product turns each core's counter deltas into (total, idle, iowait) seconds.
        # guest time is already part of user/nice on Linux; counting it again would inflate the total.
        self._weights = np.array([[f not in ("guest", "guest_nice"), f in ("idle", "iowait"), f == "iowait"]
                                  for f in fields], dtype=np.float64)
        # The rows /proc/stat has (online cores), so the per-core columns match what is read each time.
        self.cores = len(psutil.cpu_times(percpu=True)) or psutil.cpu_count(logical=True) or 1
        disks = psutil.disk_io_counters(perdisk=True, nowrap=False) or {}
        self._disks = physical_disks(list(disks))
        nics = psutil.net_io_counters(pernic=True, nowrap=False) or {}
        self._nics = physical_nics(list(nics))
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

    def _read(self) -> _Counters:
        mono = time.monotonic()
        cpu = np.asarray(psutil.cpu_times(percpu=True), dtype=np.float64)
        disks = psutil.disk_io_counters(perdisk=True, nowrap=False) or {}
        rd = wr = 0.0
        for name in self._disks:
            d = disks.get(name)
            if d is not None:
                rd += d.read_bytes
                wr += d.write_bytes
        nics = psutil.net_io_counters(pernic=True, nowrap=False) or {}
        rx = tx = 0.0
        for name in self._nics:
            n = nics.get(name)
            if n is not None:
                rx += n.bytes_recv
                tx += n.bytes_sent
        return _Counters(mono, cpu, rd, wr, rx, tx)

    def read(self) -> list[float]:
        """Values in the order of `keys()`, over the time since the previous call."""
        cur = self._read()
        prev, self._prev = self._prev, cur
        dt = cur.mono_s - prev.mono_s
        delta = cur.cpu - prev.cpu
        if delta.shape != (self.cores, self._weights.shape[0]):  # a core went offline: no CPU values this time
            delta = np.full((self.cores, self._weights.shape[0]), np.nan)
        per_core = delta @ self._weights
        rows = np.vstack((per_core.sum(axis=0), per_core))  # row 0: all cores, then each core
        total = rows[:, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            total = np.where(total > 0, total, np.nan)
            util = np.clip(100.0 * (total - rows[:, 1]) / total, 0.0, 100.0)
            iowait = np.clip(100.0 * rows[:, 2] / total, 0.0, 100.0)
        out = np.column_stack((util, iowait)).ravel().tolist()
        vm = psutil.virtual_memory()
        out += [float(vm.percent), float(vm.total - vm.available)]
        out += [_rate(cur.disk_read - prev.disk_read, dt), _rate(cur.disk_write - prev.disk_write, dt),
                _rate(cur.net_rx - prev.net_rx, dt), _rate(cur.net_tx - prev.net_tx, dt)]
        return out


def _rate(delta: float, dt: float) -> float:
    """Bytes per second; a counter that went backwards (wrap, device reset) gives no value, not a spike."""
    if dt <= 0 or delta < 0:
        return _NAN
    return delta / dt
