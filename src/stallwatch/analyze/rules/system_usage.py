"""OverallSystemUsage (RULES.md): how busy every node was; informational, never fires.

Per node and metric, over every snapshot (no patience: the table describes the whole run) — max, p99,
p95, p50, min:

- `CPU`: total CPU utilization (`cpu/cpu_util`), %;
- `CPU memory`: `memory/mem_util`, %;
- `GPU`: per snapshot, the mean utilization of the node's GPUs (those with a value), %;
- `GPU memory`: per snapshot, the mean memory utilization of the node's GPUs, %;
- `I/O`: total I/O wait (`cpu/cpu_iowait`), %;
- `Network`: received + sent bytes per second (`net/net_rx_bps` + `net/net_tx_bps`).

`Details[metric][node]` as SageMaker's report read it (a metric a node lacks is left out for it; a
metric no node has is left out). `Details["devices"][node][device][metric]` holds the same statistics
per core (`cpuN` utilization), per GPU (utilization and memory), and for the node's disks and network
(read/write, received/sent bytes per second).

Evaluation points: none (RuleTriggered and Violations are 0). Datapoints: snapshots, summed over nodes.

Percentiles need the whole series: each is kept as a `Distribution` — percentages as counts per 0.01 %
(the stored resolution; the GPU means are rounded to it), a few kB per series however long the run;
byte rates (few series) as sorted float64 values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallwatch.analyze.rules.base import Chunk, NodeFrame, Rule, RuleResult
from stallwatch.analyze.rules.kit.checks import rounded
from stallwatch.analyze.rules.kit.details import DetailsRecord, json_key
from stallwatch.analyze.rules.kit.stats import Distribution
from stallwatch.records import (
    COLUMN_SEP,
    CPU,
    CPU_IOWAIT,
    CPU_UTIL,
    DISK,
    DISK_READ_BPS,
    DISK_WRITE_BPS,
    GPU_MEM_UTIL,
    GPU_UTIL,
    MEM_UTIL,
    MEMORY,
    NET,
    NET_RX_BPS,
    NET_TX_BPS,
)

# node-level metrics: report name -> how to get them from a frame
_CPU, _MEM, _GPU, _GPU_MEM, _IO, _NET = "CPU", "CPU memory", "GPU", "GPU memory", "I/O", "Network"
METRICS = (_CPU, _MEM, _GPU, _GPU_MEM, _IO, _NET)
_SINGLE = {_CPU: (CPU, CPU_UTIL), _MEM: (MEMORY, MEM_UTIL), _IO: (CPU, CPU_IOWAIT)}
_RATES = {(NET, NET_RX_BPS), (NET, NET_TX_BPS), (DISK, DISK_READ_BPS), (DISK, DISK_WRITE_BPS)}


@dataclass(frozen=True)
class UsageStats(DetailsRecord):
    """A metric over the run on one node (or device): max, p99, p95, p50, min, in the metric's unit (% for
    utilization, bytes/s for throughput)."""

    max: float | None = None
    p99: float | None = None
    p95: float | None = None
    p50: float | None = None
    min: float | None = None

    def as_stats(self) -> dict[str, float]:
        """The statistics present, by name (what a chart of devices draws)."""
        return {k: v for k, v in (("max", self.max), ("p99", self.p99), ("p95", self.p95), ("p50", self.p50),
                                  ("min", self.min)) if v is not None}

    def __bool__(self) -> bool:
        return bool(self.as_stats())


@dataclass(frozen=True)
class OverallSystemUsageDetails(DetailsRecord):
    """OverallSystemUsage's Details (SageMaker's keys): per metric group ("CPU", "CPU memory", "GPU", "GPU memory",
    "I/O", "Network") and node its statistics; per node, device and metric (`devices`) likewise."""

    rule = "OverallSystemUsage"
    cpu: dict[str, UsageStats] = json_key("CPU", {})
    cpu_memory: dict[str, UsageStats] = json_key("CPU memory", {})
    gpu: dict[str, UsageStats] = json_key("GPU", {})
    gpu_memory: dict[str, UsageStats] = json_key("GPU memory", {})
    io: dict[str, UsageStats] = json_key("I/O", {})
    network: dict[str, UsageStats] = json_key("Network", {})
    devices: dict[str, dict[str, dict[str, UsageStats]]] = field(default_factory=dict)

    def metric(self, group: str) -> dict[str, UsageStats]:
        """A metric group by its stored name ("CPU", "GPU memory", …), per node."""
        name = next((f for f, k in self.json_keys().items() if k == group), None)
        return getattr(self, name) if name is not None else {}


@dataclass
class _Node:
    snapshots: int = 0
    metrics: dict[str, Distribution] = field(default_factory=dict)  # report metric -> values
    devices: dict[tuple[str, str], Distribution] = field(default_factory=dict)  # (device, metric) -> values


@dataclass(frozen=True)
class _Summary:
    """A node's statistics once its data is complete (the `_Node`'s series reduced to what `result()` reports)."""

    snapshots: int
    metrics: dict[str, dict[str, float]]  # report metric -> stats (empty ones left out)
    devices: dict[str, dict[str, dict[str, float]]]  # device -> metric -> stats


def _summary(st: _Node) -> _Summary:
    metrics = {m: stats for m in METRICS if (stats := _stats(st.metrics.get(m), m == _NET))}
    devices: dict[str, dict[str, dict[str, float]]] = {}
    for device, metric in sorted(st.devices, key=_device_order):
        stats = _stats(st.devices[(device, metric)], (device, metric) in _RATES)
        if stats:
            devices.setdefault(device, {})[metric] = stats
    return _Summary(st.snapshots, metrics, devices)


def _col(device: str, metric: str) -> str:
    return f"{device}{COLUMN_SEP}{metric}"


def _mean_of(frame: NodeFrame, devices: list[str], metric: str) -> np.ndarray:
    """Per snapshot, the mean over devices that have a value (NaN where none has), column by column, at the
    stored resolution (0.01)."""
    total = np.zeros(len(frame))
    count = np.zeros(len(frame), np.int32)
    for d in devices:
        x = frame.columns[_col(d, metric)]
        ok = ~np.isnan(x)
        total += np.where(ok, x, 0.0)
        count += ok
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.round(np.where(count > 0, total / np.maximum(count, 1), np.nan), 2)


class OverallSystemUsage(Rule):
    """Resource usage statistics per node, metric and device (see the module docstring); never fires."""

    name = "OverallSystemUsage"
    metrics = (CPU_UTIL, CPU_IOWAIT, MEM_UTIL, GPU_UTIL, GPU_MEM_UTIL, NET_RX_BPS, NET_TX_BPS, DISK_READ_BPS,
               DISK_WRITE_BPS)
    description = ("Summarizes the resource utilization of every node: total CPU and GPU utilization, memory "
                   "utilization on CPU and GPU, I/O wait time and network throughput, with minimum, maximum and "
                   "the 50th, 95th and 99th percentiles, per node and per device. The rule never triggers.")
    recommendation = ("Compare the utilization of CPUs and GPUs: if both are low, the instance is too large for "
                      "the job; if GPUs are low while CPUs are high, check the CPU bottleneck and data loading "
                      "analyses.")
    defaults: dict[str, Any] = {}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._nodes: dict[str, _Node] = {}
        self._done: dict[str, _Summary] = {}  # nodes whose data is complete, reduced to their statistics

    def update(self, chunk: Chunk) -> None:
        for node, frame in chunk.system.items():
            if node in self._done:  # present in later chunks with no rows
                continue
            st = self._nodes.setdefault(node, _Node())
            n = len(frame)
            st.snapshots += n
            if n == 0:
                continue
            for name, (device, metric) in _SINGLE.items():
                x = frame.columns.get(_col(device, metric))
                if x is not None:
                    st.metrics.setdefault(name, Distribution()).add(x)
            gpus = frame.devices("gpu", GPU_UTIL)
            if gpus:
                st.metrics.setdefault(_GPU, Distribution()).add(_mean_of(frame, gpus, GPU_UTIL))
            mems = frame.devices("gpu", GPU_MEM_UTIL)
            if mems:
                st.metrics.setdefault(_GPU_MEM, Distribution()).add(_mean_of(frame, mems, GPU_MEM_UTIL))
            rx, tx = frame.columns.get(_col(NET, NET_RX_BPS)), frame.columns.get(_col(NET, NET_TX_BPS))
            if rx is not None or tx is not None:
                rx = rx if rx is not None else np.full(n, np.nan)
                tx = tx if tx is not None else np.full(n, np.nan)
                both = np.where(np.isnan(rx) & np.isnan(tx), np.nan, np.nan_to_num(rx) + np.nan_to_num(tx))
                st.metrics.setdefault(_NET, Distribution(None, np.float64)).add(both)
            for key in self._device_keys(frame):
                dist = Distribution(None, np.float64) if key in _RATES else Distribution()
                st.devices.setdefault(key, dist).add(frame.columns[_col(*key)])
        for node in chunk.done:
            if node in self._nodes:
                self._done[node] = _summary(self._nodes.pop(node))

    def merge(self, other: Rule, node: str) -> None:
        assert isinstance(other, OverallSystemUsage)
        if node in other._done:
            self._nodes.pop(node, None)
            self._done[node] = other._done[node]
        elif node in other._nodes:
            self._nodes[node] = other._nodes[node]

    @staticmethod
    def _device_keys(frame: NodeFrame) -> list[tuple[str, str]]:
        keys = [(d, CPU_UTIL) for d in frame.devices(CPU, CPU_UTIL)]
        keys += [(d, m) for m in (GPU_UTIL, GPU_MEM_UTIL) for d in frame.devices("gpu", m)]
        keys += [k for k in sorted(_RATES) if _col(*k) in frame.columns]
        return keys

    def result(self) -> RuleResult:
        summaries = {**self._done, **{node: _summary(st) for node, st in self._nodes.items()}}
        if not summaries:
            return self.not_applicable("no system data: no node reported any snapshot",
                                       {"reason": "no system data: no node reported any snapshot"})
        details: dict[str, Any] = {}
        nodes = sorted(summaries)
        for metric in METRICS:
            per_node = {node: summaries[node].metrics[metric] for node in nodes if metric in summaries[node].metrics}
            if per_node:
                details[metric] = per_node
        details["devices"] = {node: summaries[node].devices for node in nodes if summaries[node].devices}
        datapoints = sum(s.snapshots for s in summaries.values())
        return self.make_result(triggered=0, violations=0, datapoints=datapoints, details=details,
                                recommendation=self._advice(details, nodes))

    def _advice(self, details: dict[str, Any], nodes: list[str]) -> str | None:
        """The verdicts SageMaker's report drew from this table, per node."""
        texts = []
        cpu, gpu = details.get(_CPU, {}), details.get(_GPU, {})
        for node in nodes:
            c, g = cpu.get(node), gpu.get(node)
            if g and c:
                if g["p95"] < 70 and c["p95"] < 70:
                    texts.append(f"The 95th percentile of the total GPU utilization on node {node} is only "
                                 f"{g['p95']:.0f} % and that of the total CPU utilization only {c['p95']:.0f} %: node "
                                 f"{node} is underutilized. You may want to consider switching to a smaller "
                                 f"instance type or increasing the batch size.")
                elif g["p95"] < 70 and c["p95"] > 70:
                    texts.append(f"The 95th percentile of the total GPU utilization on node {node} is only "
                                 f"{g['p95']:.0f} %, while that of the total CPU utilization is {c['p95']:.0f} %: the "
                                 f"GPUs on node {node} are underutilized, likely because of CPU bottlenecks.")
                elif g["p50"] > 70:
                    texts.append(f"The median total GPU utilization on node {node} is {g['p50']:.0f} %: the GPUs "
                                 f"on node {node} are well utilized.")
                else:
                    texts.append(f"The median total GPU utilization on node {node} is {g['p50']:.0f} %, the median "
                                 f"total CPU utilization {c['p50']:.0f} %.")
            elif c:
                if c["p95"] > 70:
                    texts.append(f"The 95th percentile of the total CPU utilization on node {node} is "
                                 f"{c['p95']:.0f} %: the CPUs on node {node} are well utilized.")
                else:
                    texts.append(f"The 95th percentile of the total CPU utilization on node {node} is only "
                                 f"{c['p95']:.0f} %: node {node} is underutilized; a smaller instance would do.")
        return " ".join(texts) if texts else None


def _stats(values: Distribution | None, rate: bool) -> dict[str, float]:
    if values is None:
        return {}
    return rounded(values.summary(), 1 if rate else 4)


def _device_order(key: tuple[str, str]) -> tuple[int, int, str, str]:
    device, metric = key
    kind = 0 if device.startswith(CPU) else 1 if device.startswith("gpu") else 2
    digits = "".join(ch for ch in device if ch.isdigit())
    return (kind, int(digits) if digits else -1, device, metric)
