"""SageMaker's system-metric vocabulary (Type, Name, Dimension) in stallwatch's (device, metric): one table,
mirrored in docs/format.md. A series with no counterpart is counted, never guessed."""

from __future__ import annotations

import re

from stallwatch import records as r
from stallwatch.records import MetricKey

DISK_IOPS = "disk_iops"  # SageMaker only: I/O operations per second (the sampler does not record it)
NET_ALGORITHM = "net_algorithm"  # traffic SageMaker attributes to the training container
NET_PLATFORM = "net_platform"  # traffic of SageMaker's platform on the instance (input download, uploads)

_NUMBERED = re.compile(r"^(cpu|gpu)(\d{1,4})$")
_BY_NAME = {  # (type, name) -> key, any dimension
    ("memory", "memoryusedpercent"): MetricKey(r.MEMORY, r.MEM_UTIL),
    ("i/o", "readthroughputinbytespersecond"): MetricKey(r.DISK, r.DISK_READ_BPS),
    ("i/o", "writethroughputinbytespersecond"): MetricKey(r.DISK, r.DISK_WRITE_BPS),
    ("i/o", "iops"): MetricKey(r.DISK, DISK_IOPS),
}
_NETWORK = {"receivebytespersecond": r.NET_RX_BPS, "transmitbytespersecond": r.NET_TX_BPS}
_NET_DEVICES = {"algorithm": NET_ALGORITHM, "platform": NET_PLATFORM}
_PER_CORE = {"cpuutilization": r.CPU_UTIL, "i/owaitpercentage": r.CPU_IOWAIT}
_PER_GPU = {"gpuutilization": r.GPU_UTIL, "gpumemoryutilization": r.GPU_MEM_UTIL}

# Series stallwatch derives from the imported ones: the node's CPU as the mean of its cores (what the sampler's
# `cpu` device is), and the node's network as the sum of SageMaker's two attributions.
DERIVED_MEAN = {MetricKey(r.CPU, r.CPU_UTIL): (r.CPU_UTIL, "cpu"), MetricKey(r.CPU, r.CPU_IOWAIT): (r.CPU_IOWAIT, "cpu")}
DERIVED_SUM = {MetricKey(r.NET, r.NET_RX_BPS): r.NET_RX_BPS, MetricKey(r.NET, r.NET_TX_BPS): r.NET_TX_BPS}


def map_series(type_: str | None, name: str | None, dimension: str | None) -> MetricKey | None:
    """The stored series of one SageMaker (Type, Name, Dimension); None when stallwatch has no counterpart."""
    t, n, d = (type_ or "").strip().lower(), (name or "").strip().lower(), (dimension or "").strip().lower()
    m = _NUMBERED.match(n)
    if m and t == m.group(1):
        metric = (_PER_CORE if t == "cpu" else _PER_GPU).get(d)
        return None if metric is None else MetricKey(f"{t}{int(m.group(2))}", metric)
    if t == "network":
        metric, device = _NETWORK.get(n), _NET_DEVICES.get(d)
        return None if metric is None or device is None else MetricKey(device, metric)
    return _BY_NAME.get((t, n))


def derived_keys(keys: set[MetricKey]) -> set[MetricKey]:
    """The derived series a node gets from the imported `keys`."""
    out = set()
    for key, (metric, prefix) in DERIVED_MEAN.items():
        if any(k.metric == metric and k.device.startswith(prefix) and k.device[len(prefix):].isdigit() for k in keys):
            out.add(key)
    for key, metric in DERIVED_SUM.items():
        if any(k.metric == metric and k.device in (NET_ALGORITHM, NET_PLATFORM) for k in keys):
            out.add(key)
    return out


def device_order(key: MetricKey) -> tuple:
    """Column order in stored files: the sampler's (cpu, cores, memory, disk, net, GPUs)."""
    d = key.device
    m = re.match(r"^([a-z_]+?)(\d*)$", d)
    stem, num = (m.group(1), int(m.group(2)) if m.group(2) else -1) if m else (d, -1)
    rank = {"cpu": 0, "memory": 2, "disk": 3, "net": 4, NET_ALGORITHM: 5, NET_PLATFORM: 6, "gpu": 7}.get(stem, 8)
    if stem == "cpu" and num >= 0:
        rank = 1
    return (rank, num, d, key.metric)
