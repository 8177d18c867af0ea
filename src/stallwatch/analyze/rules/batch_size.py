"""BatchSize (RULES.md): windows where CPU, GPU and GPU memory are all low, so a larger batch would fit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallwatch.analyze.finding import LOW, Finding, Where, finding
from stallwatch.analyze.rules.base import Chunk, Rule, RuleResult
from stallwatch.analyze.rules.kit.checks import check_counts, listing, rounded
from stallwatch.analyze.rules.kit.details import BoxStats, DetailsRecord, rest
from stallwatch.analyze.rules.kit.stats import Distribution, Frozen
from stallwatch.analyze.rules.kit.windows import (
    Block,
    Flagged,
    FlaggedWindows,
    Windows,
    all_not_applicable,
    flagged_details,
    gpu_series,
    note_skipped,
    ordered_columns,
    take_node,
)
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import COLUMN_SEP, CPU, CPU_UTIL, GPU_MEM_UTIL, GPU_UTIL

_TOTAL_CPU = f"{CPU}{COLUMN_SEP}{CPU_UTIL}"


@dataclass(frozen=True)
class BatchNode(DetailsRecord):
    """One node's entry, Details[node]: box statistics (%) of its total CPU ("cpu"), each GPU's utilization
    ("gpu0") and memory ("gpu0_memory"), in that order; its windows and how many were flagged; the last flagged
    window's end (µs)."""

    series: dict[str, BoxStats] = rest()
    windows: int = 0
    violations: int = 0
    last_timestamp: int | None = None


@dataclass(frozen=True)
class BatchSizeDetails(DetailsRecord):
    """BatchSize's Details: per node, the last flagged window's time (µs), the flagged windows, and the nodes
    without GPU data."""

    rule = "BatchSize"
    nodes: dict[str, BatchNode] = rest()
    last_timestamp: int | None = None
    flagged_windows: FlaggedWindows | None = None  # None in results stored before windows were listed
    not_applicable: dict[str, str] = field(default_factory=dict)

    @property
    def flagged(self) -> FlaggedWindows:
        return self.flagged_windows or FlaggedWindows()

    def last_flagged(self) -> list[tuple[str, str | None, int]]:
        """(node, None, µs) of each node's last flagged window: all a result stored before windows were listed has."""
        return [(node, None, e.last_timestamp) for node, e in self.nodes.items() if e.last_timestamp is not None]


@dataclass
class _BatchNode:
    windows: Windows
    has_gpu: bool = False
    snapshots: int = 0
    n_windows: int = 0
    violations: int = 0
    last_timestamp: int | None = None
    values: dict[str, Distribution] = field(default_factory=dict)  # column -> values
    flagged: Flagged = field(default_factory=Flagged)

    def freeze(self) -> None:
        """The node's data is complete: keep its statistics, not its values."""
        self.values = {col: Frozen(v) for col, v in self.values.items()}  # type: ignore[misc]


class BatchSize(Rule):
    """Per node, per window (`window` snapshots after `patience`): p95 of total CPU utilization below
    `cpu_threshold_p95`, and for some GPU both p95 of its utilization below `gpu_threshold_p95` and p95
    of its memory utilization below `gpu_memory_threshold_p95` -> the batch is too small for the
    instance.

    Evaluation points: the windows of each node; RuleTriggered and Violations both count the flagged
    windows. Datapoints: snapshots in evaluated windows. Details[node]: box-plot stats of `cpu`, each
    `gpuN` and `gpuN_memory` (memory from memory alone) over all evaluated snapshots, plus `windows`,
    `violations` and `last_timestamp` (end of the node's last flagged window); Details["last_timestamp"]:
    the latest over nodes."""

    name = "BatchSize"
    metrics = (CPU_UTIL, GPU_UTIL, GPU_MEM_UTIL)
    description = ("Checks if GPUs are underutilized because the batch size is too small. To detect this "
                   "problem, the rule analyzes the average GPU memory footprint, the CPU and the GPU utilization. ")
    recommendation = ("The batch size is too small, and GPUs are underutilized. Consider running on a smaller "
                      "instance type or increasing the batch size.")
    defaults = {"cpu_threshold_p95": 70, "gpu_threshold_p95": 70, "gpu_memory_threshold_p95": 70,
                "patience": 1000, "window": 500}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window", "patience")
        self._nodes: dict[str, _BatchNode] = {}

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        p = self.params
        for node, frame in chunk.system.items():
            st = self._nodes.get(node)
            if st is None:
                st = self._nodes[node] = _BatchNode(Windows(p["patience"], p["window"]))
            util = gpu_series(frame, GPU_UTIL)
            cols = {}
            if _TOTAL_CPU in frame.columns:
                cols[_TOTAL_CPU] = frame.columns[_TOTAL_CPU]
            cols.update(util)
            cols.update(gpu_series(frame, GPU_MEM_UTIL))
            st.has_gpu |= bool(util) and len(frame) > 0
            done = node in chunk.done  # nothing more comes for it: its partial window is its last
            block = st.windows.feed(frame.timestamps, cols, flush=chunk.final or done)
            if block is not None:
                self._judge(st, block)
            if done:
                st.freeze()

    def merge(self, other: Rule, node: str) -> None:
        """Every statistic here is per node and the result orders nodes by name: `node`'s state is taken whole."""
        assert isinstance(other, BatchSize)
        take_node(self._nodes, other._nodes, node, lambda st: st.windows.seen)

    def _judge(self, st: _BatchNode, block: Block) -> None:
        """The windows `block` completes on one node."""
        p = self.params
        st.snapshots += block.size
        st.n_windows += block.n_windows
        for col, x in block.cols.items():
            st.values.setdefault(col, Distribution()).add(x)
        nan = np.full(block.size, np.nan)
        cpu95 = block.percentiles(block.cols.get(_TOTAL_CPU, nan), (95.0,))[:, 0]
        some_gpu = np.zeros(block.n_windows, bool)
        for col in block.cols:
            device, _, metric = col.partition(COLUMN_SEP)
            if metric != GPU_UTIL:
                continue
            u95 = block.percentiles(block.cols[col], (95.0,))[:, 0]
            m95 = block.percentiles(block.cols.get(f"{device}{COLUMN_SEP}{GPU_MEM_UTIL}", nan), (95.0,))[:, 0]
            with np.errstate(invalid="ignore"):
                some_gpu |= (u95 < p["gpu_threshold_p95"]) & (m95 < p["gpu_memory_threshold_p95"])
        with np.errstate(invalid="ignore"):
            bad = (cpu95 < p["cpu_threshold_p95"]) & some_gpu
        st.violations += int(bad.sum())
        if bad.any():
            st.last_timestamp = int(block.ends()[np.flatnonzero(bad)[-1]])
        st.flagged.add(block, {"": bad})  # the node as a whole: no device named

    def result(self) -> RuleResult:
        nodes = {n: s for n, s in self._nodes.items() if s.has_gpu}
        if not nodes:
            return all_not_applicable(self, self._nodes)
        details: dict[str, Any] = {}
        violations = datapoints = 0
        last: int | None = None
        findings: list[str] = []
        for node in sorted(nodes):
            st = nodes[node]
            datapoints += st.snapshots
            violations += st.violations
            entry: dict[str, Any] = {}
            if _TOTAL_CPU in st.values:
                entry["cpu"] = rounded(st.values[_TOTAL_CPU].box_stats())
            for col in ordered_columns({c: 0 for c in st.values if c != _TOTAL_CPU}):
                device, _, metric = col.partition(COLUMN_SEP)
                key = device if metric == GPU_UTIL else f"{device}_memory"
                entry[key] = rounded(st.values[col].box_stats())
            # gpuN before gpuN_memory, GPUs in number order
            entry = dict(sorted(entry.items(), key=lambda kv: _batch_key_order(kv[0])))
            entry.update({"windows": st.n_windows, "violations": st.violations, "last_timestamp": st.last_timestamp})
            details[node] = entry
            if st.last_timestamp is not None:
                last = st.last_timestamp if last is None else max(last, st.last_timestamp)
            if st.violations:
                gpus = [k for k in entry if k.startswith("gpu") and not k.endswith("_memory") and entry[k]]
                gpu95 = max((entry[k]["p95"] for k in gpus), default=None)
                mem95 = max((entry[f"{k}_memory"]["p95"] for k in gpus if entry.get(f"{k}_memory")), default=None)
                cpu95 = entry.get("cpu", {}).get("p95")
                findings.append(f"node {node}: {st.violations} of {st.n_windows} windows had low CPU, GPU and "
                                f"GPU memory usage (over the run p95 of CPU {_pct(cpu95)}, of the busiest GPU "
                                f"{_pct(gpu95)}, of GPU memory at most {_pct(mem95)})")
        details["last_timestamp"] = last
        details["flagged_windows"] = flagged_details(nodes)
        message = note_skipped(details, self._nodes)
        recommendation = f"{listing(findings)}. {self.recommendation}" if findings else None
        return self.make_result(triggered=violations, violations=violations, datapoints=datapoints,
                                details=details, message=message, recommendation=recommendation)


def _batch_key_order(key: str) -> tuple[int, int, str]:
    if key == "cpu":
        return (-1, 0, key)
    base = key[: -len("_memory")] if key.endswith("_memory") else key
    digits = "".join(ch for ch in base if ch.isdigit())
    return (int(digits) if digits else 10**9, 1 if key.endswith("_memory") else 0, key)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} %"


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """An instance too large for the batch: no time at stake."""
    if not r.fired:
        return []
    flagged = BatchSizeDetails.from_json(r.details).flagged_windows
    return [finding(r, s, "batch", "CPUs and GPUs underused: the batch may be too small for this instance", None,
                    Where(flagged.nodes if flagged is not None else []),
                    {"flagged_windows": flagged.total if flagged is not None else None}, severity=LOW)]
