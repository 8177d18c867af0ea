"""LowGPUUtilization (RULES.md): per GPU, windows whose p95 utilization is low (underutilized) or whose p5 is
far below it (fluctuating)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallwatch.analyze.finding import LISTED_WINDOWS, Finding, Where, finding
from stallwatch.analyze.rules.base import Chunk, Rule, RuleResult
from stallwatch.analyze.rules.kit.checks import check_counts, listing, plain_float, rounded
from stallwatch.analyze.rules.kit.details import DetailsRecord, rest
from stallwatch.analyze.rules.kit.stats import Distribution, Frozen
from stallwatch.analyze.rules.kit.windows import (
    Block,
    Flagged,
    FlaggedWindows,
    Windows,
    all_not_applicable,
    device_of,
    flagged_details,
    gpu_series,
    note_skipped,
    ordered_columns,
    take_node,
)
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import GPU_UTIL


@dataclass(frozen=True)
class GpuUtilization(DetailsRecord):
    """One GPU's entry, Details[node][gpu]: its utilization (%) over the snapshots after patience (max, p95, p5
    and box statistics), its windows and how many were underutilized (p95 < threshold_p95) or fluctuating
    (p5 < threshold_p5), the lowest window p95/p5 among those, and when it was last flagged (µs)."""

    gpu_max: float | None = None
    gpu_95: float | None = None
    gpu_5: float | None = None
    p25: float | None = None
    p50: float | None = None
    p75: float | None = None
    p95: float | None = None
    upper: float | None = None
    lower: float | None = None
    case: str | None = None  # "underutilized", "fluctuating" or None
    windows: int = 0
    underutilized: int = 0
    fluctuating: int = 0
    lowest_window_p95: float | None = None
    lowest_window_p5: float | None = None
    last_timestamp: int | None = None

    def box(self) -> dict[str, float] | None:
        """Box-plot statistics with the max, or None where no snapshot was evaluated."""
        if self.gpu_max is None or self.p50 is None:
            return None
        parts = (self.p25, self.p50, self.p75, self.p95, self.upper, self.lower)
        if any(v is None for v in parts):
            return None
        return {"p25": self.p25, "p50": self.p50, "p75": self.p75, "p95": self.p95, "upper": self.upper,
                "lower": self.lower, "max": self.gpu_max}  # type: ignore[dict-item]


@dataclass(frozen=True)
class LowGPUUtilizationDetails(DetailsRecord):
    """LowGPUUtilization's Details: per node and GPU (SageMaker's `Details[node][gpu]`), the last flagged window's
    time (µs), the flagged windows, and the nodes without GPU data."""

    rule = "LowGPUUtilization"
    nodes: dict[str, dict[str, GpuUtilization]] = rest()
    last_timestamp: int | None = None
    flagged_windows: FlaggedWindows | None = None  # None in results stored before windows were listed
    not_applicable: dict[str, str] = field(default_factory=dict)

    @property
    def flagged(self) -> FlaggedWindows:
        return self.flagged_windows or FlaggedWindows()

    def last_flagged(self) -> list[tuple[str, str | None, int]]:
        """(node, GPU, µs) of each GPU's last flagged window: all a result stored before windows were listed has."""
        return [(node, gpu, g.last_timestamp) for node, gpus in self.nodes.items() for gpu, g in gpus.items()
                if g.last_timestamp is not None]

    def gpus(self) -> list[GpuUtilization]:
        return [g for gpus in self.nodes.values() for g in gpus.values()]


@dataclass
class _GpuWindows:
    values: Distribution = field(default_factory=Distribution)
    windows: int = 0  # windows with data for this GPU
    underutilized: int = 0
    fluctuating: int = 0
    last_timestamp: int | None = None
    lowest_p95: float | None = None  # over underutilized windows
    lowest_p5: float | None = None  # over fluctuating windows


def _lowest(current: float | None, values: np.ndarray) -> float | None:
    if values.size == 0:
        return current
    low = float(values.min())
    return low if current is None else min(current, low)


@dataclass
class _LowNode:
    windows: Windows
    has_gpu: bool = False
    snapshots: int = 0
    n_windows: int = 0
    triggered: int = 0
    gpus: dict[str, _GpuWindows] = field(default_factory=dict)
    flagged: Flagged = field(default_factory=Flagged)

    def freeze(self) -> None:
        """The node's data is complete: keep its statistics, not its values."""
        for acc in self.gpus.values():
            acc.values = Frozen(acc.values)  # type: ignore[assignment]


class LowGPUUtilization(Rule):
    """Per node and GPU, per window (`window` snapshots after `patience`): p95 of utilization below
    `threshold_p95` -> underutilized; p95 above `threshold_p95` and p5 below `threshold_p5` ->
    fluctuating.

    Evaluation points: the windows of each node (all its GPUs at once); RuleTriggered counts windows in
    which some GPU was underutilized or fluctuating, Violations the (window, GPU) pairs that were.
    Datapoints: snapshots in evaluated windows. Details[node][gpu]: `gpu_max`, `gpu_95`, `gpu_5` and the
    box-plot stats over all evaluated snapshots, `case` (the more frequent of "underutilized" /
    "fluctuating", None if neither), window counts, the lowest window p95 among underutilized windows and
    the lowest window p5 among fluctuating ones, `last_timestamp` (end of its last flagged window);
    Details["last_timestamp"]: the latest of them."""

    name = "LowGPUUtilization"
    metrics = (GPU_UTIL,)
    description = ("Checks if the GPU utilization is low or fluctuating. This can happen due to bottlenecks, "
                   "blocking calls for synchronizations, or a small batch size.")
    recommendation = ("Check if there are bottlenecks, minimize blocking calls, change distributed training "
                      "strategy, or increase the batch size.")
    defaults = {"threshold_p95": 70, "threshold_p5": 10, "window": 500, "patience": 1000}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window", "patience")
        self._nodes: dict[str, _LowNode] = {}

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        t95, t5 = self.params["threshold_p95"], self.params["threshold_p5"]
        for node, frame in chunk.system.items():
            st = self._nodes.get(node)
            if st is None:
                st = self._nodes[node] = _LowNode(Windows(self.params["patience"], self.params["window"]))
            cols = gpu_series(frame, GPU_UTIL)
            st.has_gpu |= bool(cols) and len(frame) > 0
            done = node in chunk.done  # nothing more comes for it: its partial window is its last
            block = st.windows.feed(frame.timestamps, cols, flush=chunk.final or done)
            if block is not None:
                self._judge(st, block, t95, t5)
            if done:
                st.freeze()

    def merge(self, other: Rule, node: str) -> None:
        """Every statistic here is per node and the result orders nodes by name: `node`'s state is taken whole."""
        assert isinstance(other, LowGPUUtilization)
        take_node(self._nodes, other._nodes, node, lambda st: st.windows.seen)

    def _judge(self, st: _LowNode, block: Block, t95: float, t5: float) -> None:
        """The windows `block` completes on one node."""
        st.snapshots += block.size
        st.n_windows += block.n_windows
        ends = block.ends()
        flagged = np.zeros(block.n_windows, bool)
        by_gpu: dict[str, np.ndarray] = {}
        for col, x in block.cols.items():
            acc = st.gpus.setdefault(device_of(col), _GpuWindows())
            acc.values.add(x)
            q = block.percentiles(x, (5.0, 95.0))
            p5, p95 = q[:, 0], q[:, 1]
            with np.errstate(invalid="ignore"):
                under = p95 < t95
                fluct = (p95 > t95) & (p5 < t5)
            acc.windows += int(np.count_nonzero(~np.isnan(p95)))
            acc.underutilized += int(under.sum())
            acc.fluctuating += int(fluct.sum())
            acc.lowest_p95 = _lowest(acc.lowest_p95, p95[under])
            acc.lowest_p5 = _lowest(acc.lowest_p5, p5[fluct])
            bad = under | fluct
            if bad.any():
                acc.last_timestamp = int(ends[np.flatnonzero(bad)[-1]])
            flagged |= bad
            by_gpu[device_of(col)] = bad
        st.triggered += int(flagged.sum())
        st.flagged.add(block, by_gpu)

    def result(self) -> RuleResult:
        nodes = {n: s for n, s in self._nodes.items() if s.has_gpu}
        if not nodes:
            return all_not_applicable(self, self._nodes)
        t95, t5 = self.params["threshold_p95"], self.params["threshold_p5"]
        details: dict[str, Any] = {}
        violations = triggered = datapoints = 0
        last: int | None = None
        findings: list[str] = []
        for node in sorted(nodes):
            st = nodes[node]
            datapoints += st.snapshots
            triggered += st.triggered
            per_gpu: dict[str, Any] = {}
            for gpu in ordered_columns(st.gpus):
                acc = st.gpus[gpu]
                v = acc.values
                violations += acc.underutilized + acc.fluctuating
                if acc.last_timestamp is not None:
                    last = acc.last_timestamp if last is None else max(last, acc.last_timestamp)
                case = None
                if acc.underutilized or acc.fluctuating:
                    case = "underutilized" if acc.underutilized >= acc.fluctuating else "fluctuating"
                entry: dict[str, Any] = {"gpu_max": None, "gpu_95": None, "gpu_5": None}
                if v.n:
                    p5, p95 = v.percentiles((5, 95))
                    entry = {"gpu_max": plain_float(v.max()), "gpu_95": plain_float(p95), "gpu_5": plain_float(p5)}
                    entry.update(rounded(v.box_stats()))
                entry.update({"case": case, "windows": acc.windows, "underutilized": acc.underutilized,
                              "fluctuating": acc.fluctuating, "lowest_window_p95": plain_float(acc.lowest_p95),
                              "lowest_window_p5": plain_float(acc.lowest_p5), "last_timestamp": acc.last_timestamp})
                per_gpu[gpu] = entry
                if acc.underutilized:
                    findings.append(f"{gpu} on node {node} was underutilized in {acc.underutilized} of "
                                    f"{acc.windows} windows (p95 of utilization below {t95} %, down to "
                                    f"{acc.lowest_p95:.0f} %)")
                if acc.fluctuating:
                    findings.append(f"{gpu} on node {node} fluctuated in {acc.fluctuating} of {acc.windows} "
                                    f"windows (p95 above {t95} % but p5 below {t5} %, down to {acc.lowest_p5:.0f} %)")
            details[node] = per_gpu
        details["last_timestamp"] = last
        details["flagged_windows"] = flagged_details(nodes)
        message = note_skipped(details, self._nodes)
        recommendation = None
        if findings:
            recommendation = f"{listing(findings)}. {self.recommendation}"
        return self.make_result(triggered=triggered, violations=violations, datapoints=datapoints,
                                details=details, message=message, recommendation=recommendation)


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """The flagged windows, their idle share (1 - the flagged GPUs' median utilization) the time at stake."""
    if not r.fired:
        return []
    d = LowGPUUtilizationDetails.from_json(r.details)
    flagged = d.flagged
    windows = flagged.spans()
    total = flagged.total or len(windows)
    mean_len = sum(b - a for a, b in windows) / len(windows) / 1e6 if windows else 0.0
    busy = [float(g.p50) for g in d.gpus() if g.case and g.p50 is not None]
    idle_share = 1.0 - (sum(busy) / len(busy) / 100.0 if busy else 0.0)
    stake = total * mean_len * max(idle_share, 0.0) or None
    return [finding(r, s, "gpus", f"GPUs underused in {total} window(s)", stake,
                    Where(flagged.nodes, windows=windows[:LISTED_WINDOWS]),
                    {"flagged_windows": total, "median_utilization_of_flagged_gpus": busy[:16]})]
