"""One snapshot of a node: host, GPUs and the job's process tree read together under one timestamp."""

from __future__ import annotations

import os
import platform
import socket
import time
from types import ModuleType
from typing import Any

import psutil

from stallwatch.collect.contention import Competitor, ContentionReader
from stallwatch.collect.gpu import GpuReader
from stallwatch.collect.host import HostReader, nic_speeds
from stallwatch.collect.proctree import ProcessTreeReader
from stallwatch.records import MetricKey


class SystemSampler:
    """The column order (`keys`) is fixed at start, so every snapshot of a node has the same shape."""

    def __init__(self, *, gpu: bool = True, nvml: ModuleType | None = None) -> None:
        self.host = HostReader()
        self.gpus = GpuReader(nvml=nvml, enabled=gpu)
        self.tree = ProcessTreeReader(cores=self.host.cores)
        self.contention = ContentionReader(self.tree.pids)
        self.keys: list[MetricKey] = (self.host.keys() + self.gpus.keys() + self.tree.keys()
                                      + self.contention.keys())
        # Timestamps: the wall clock read once, then advanced on the monotonic clock. They never go
        # backwards when NTP steps the clock, and NTP's rate corrections (slewing) still apply.
        self._wall0_ns = time.time_ns()
        self._mono0_ns = time.monotonic_ns()

    def now_us(self) -> int:
        return (self._wall0_ns + time.monotonic_ns() - self._mono0_ns) // 1000

    def set_job_pid(self, pid: int) -> None:
        self.tree.set_root(pid)
        self.contention.set_job_pid(pid)

    def snapshot(self) -> tuple[int, list[float]]:
        ts = self.now_us()
        values = self.host.read()
        values += self.gpus.read()
        values += self.tree.read()
        values += self.contention.read()
        return ts, values

    def competitors(self) -> list[Competitor]:
        """The processes outside the job that used the most CPU while it ran (stored in the node record)."""
        return self.contention.competitors()

    def close(self) -> None:
        self.gpus.close()
        self.host.close()
        self.tree.close()
        self.contention.close()

    def describe_node(self) -> dict[str, Any]:
        """Static facts about the machine, stored with the node so the rules can compare against them."""
        vm = psutil.virtual_memory()
        return {
            "hostname": socket.gethostname(),
            "cpu_cores_logical": self.host.cores,
            "cpu_cores_physical": psutil.cpu_count(logical=False),
            "memory_total_bytes": int(vm.total),
            "nics": nic_speeds(self.host.nics),
            "gpus": self.gpus.devices,
            "gpu_driver": self.gpus.driver_version(),
            "gpu_absent_reason": self.gpus.reason_absent,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "sampler_pid": os.getpid(),
            "metrics": [k.column for k in self.keys],
        }
