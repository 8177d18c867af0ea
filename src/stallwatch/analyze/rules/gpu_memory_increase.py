"""GPUMemoryIncrease (RULES.md): a GPU's memory use rising between consecutive equal windows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallwatch.analyze.finding import LISTED_WINDOWS, MEDIUM, Finding, Where, finding
from stallwatch.analyze.rules.base import Chunk, Rule, RuleResult
from stallwatch.analyze.rules.kit.checks import check_counts, listing, plain_float, rounded, when
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
from stallwatch.records import GPU_MEM_UTIL


@dataclass(frozen=True)
class GpuMemory(DetailsRecord):
    """One GPU's entry, Details[node][gpu]: its memory utilization (%) after patience (max, p5 and box
    statistics), the largest rise between consecutive windows (points), how many rises passed `increase`, and when
    the last did (µs)."""

    increase: float | None = None
    gpu_max: float | None = None
    p05: float | None = None
    p25: float | None = None
    p50: float | None = None
    p75: float | None = None
    p95: float | None = None
    upper: float | None = None
    lower: float | None = None
    violations: int = 0
    last_timestamp: int | None = None

    def box(self) -> dict[str, float] | None:
        """Box-plot statistics, or None where no snapshot was evaluated."""
        parts = {"lower": self.lower, "p25": self.p25, "p50": self.p50, "p75": self.p75, "upper": self.upper}
        if any(v is None for v in parts.values()):
            return None
        return {**parts, **({"p95": self.p95} if self.p95 is not None else {})}  # type: ignore[dict-item]


@dataclass(frozen=True)
class GPUMemoryIncreaseDetails(DetailsRecord):
    """GPUMemoryIncrease's Details: per node and GPU, the last rise's time (µs), the flagged windows, and the nodes
    without GPU data."""

    rule = "GPUMemoryIncrease"
    nodes: dict[str, dict[str, GpuMemory]] = rest()
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


@dataclass
class _MemGpu:
    values: Distribution = field(default_factory=Distribution)
    prev_mean: float = float("nan")  # mean of the node's previous window for this GPU
    max_increase: float | None = None
    violations: int = 0
    last_timestamp: int | None = None


@dataclass
class _MemNode:
    windows: Windows
    has_gpu: bool = False
    snapshots: int = 0
    n_windows: int = 0
    triggered: int = 0
    gpus: dict[str, _MemGpu] = field(default_factory=dict)
    flagged: Flagged = field(default_factory=Flagged)

    def freeze(self) -> None:
        """The node's data is complete: keep its statistics, not its values."""
        for acc in self.gpus.values():
            acc.values = Frozen(acc.values)  # type: ignore[assignment]


class GPUMemoryIncrease(Rule):
    """Per node and GPU: the mean memory utilization of each window (`window` snapshots after
    `patience`) against the previous window's; a rise of more than `increase` percentage points is a
    violation. Windows are equal in size: a trailing partial window is never compared.

    Evaluation points: each window of a node that has a previous window (all its GPUs at once);
    RuleTriggered counts those in which some GPU's memory rose too much, Violations the (window, GPU)
    pairs. Datapoints: snapshots in complete windows. Details[node][gpu]: `increase` (the largest
    window-to-window rise, percentage points), `gpu_max`, `p05`, box-plot stats of memory utilization,
    `violations`, `last_timestamp` (end of the last window that rose too much); Details["last_timestamp"]:
    the latest of them."""

    name = "GPUMemoryIncrease"
    metrics = (GPU_MEM_UTIL,)
    description = "Measures the average GPU memory footprint and triggers if there is a large increase."
    recommendation = ("Choose a larger instance type with more memory if footprint is close to maximum "
                      "available memory.")
    defaults = {"increase": 5, "patience": 1000, "window": 10}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window", "patience")
        self._nodes: dict[str, _MemNode] = {}

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        inc = self.params["increase"]
        for node, frame in chunk.system.items():
            st = self._nodes.get(node)
            if st is None:
                st = self._nodes[node] = _MemNode(Windows(self.params["patience"], self.params["window"]))
            cols = gpu_series(frame, GPU_MEM_UTIL)
            st.has_gpu |= bool(cols) and len(frame) > 0
            done = node in chunk.done  # nothing more comes for it: a partial window is never compared
            block = st.windows.feed(frame.timestamps, cols, flush=chunk.final or done, partial_ok=False)
            if block is not None:
                self._judge(st, block, inc)
            if done:
                st.freeze()

    def merge(self, other: Rule, node: str) -> None:
        """Every statistic here is per node and the result orders nodes by name: `node`'s state is taken whole."""
        assert isinstance(other, GPUMemoryIncrease)
        take_node(self._nodes, other._nodes, node, lambda st: st.windows.seen)

    def _judge(self, st: _MemNode, block: Block, inc: float) -> None:
        """The windows `block` completes on one node."""
        st.snapshots += block.size
        st.n_windows += block.n_windows
        ends = block.ends()
        flagged = np.zeros(block.n_windows, bool)
        by_gpu: dict[str, np.ndarray] = {}
        for col, x in block.cols.items():
            acc = st.gpus.setdefault(device_of(col), _MemGpu())
            acc.values.add(x)
            means = block.means(x)
            rise = means - np.concatenate([[acc.prev_mean], means[:-1]])
            acc.prev_mean = float(means[-1])
            finite = rise[np.isfinite(rise)]
            if finite.size:
                top = float(finite.max())
                acc.max_increase = top if acc.max_increase is None else max(acc.max_increase, top)
            with np.errstate(invalid="ignore"):
                bad = rise > inc
            acc.violations += int(bad.sum())
            if bad.any():
                acc.last_timestamp = int(ends[np.flatnonzero(bad)[-1]])
            flagged |= bad
            by_gpu[device_of(col)] = bad
        # a node's first window, or a GPU's first window with data, has no previous mean: nothing compared
        st.triggered += int(flagged.sum())
        st.flagged.add(block, by_gpu)

    def result(self) -> RuleResult:
        nodes = {n: s for n, s in self._nodes.items() if s.has_gpu}
        if not nodes:
            return all_not_applicable(self, self._nodes, "GPU memory data")
        inc = self.params["increase"]
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
                violations += acc.violations
                entry: dict[str, Any] = {"increase": plain_float(acc.max_increase) if acc.max_increase is not None
                                         else None, "gpu_max": None, "p05": None}
                if v.n:
                    entry["gpu_max"] = plain_float(v.max())
                    entry["p05"] = plain_float(v.percentiles((5,))[0])
                    entry.update(rounded(v.box_stats()))
                entry.update({"violations": acc.violations, "last_timestamp": acc.last_timestamp})
                per_gpu[gpu] = entry
                if acc.last_timestamp is not None:
                    last = acc.last_timestamp if last is None else max(last, acc.last_timestamp)
                if acc.violations:
                    near = (entry["gpu_max"] or 0) >= 90
                    findings.append(
                        f"memory of {gpu} on node {node} rose by more than {inc} percentage points "
                        f"{acc.violations} time(s), by up to {entry['increase']:.1f} points (last at "
                        f"{when(acc.last_timestamp)}); its peak was {entry['gpu_max']:.0f} %"
                        + (", close to the maximum" if near else ""))
            details[node] = per_gpu
        details["last_timestamp"] = last
        details["flagged_windows"] = flagged_details(nodes)
        message = note_skipped(details, self._nodes, "GPU memory data")
        recommendation = None
        if findings:
            recommendation = (f"{listing(findings)}. Check for tensors kept alive across steps (a growing "
                              f"footprint ends in out-of-memory errors). {self.recommendation}")
        return self.make_result(triggered=triggered, violations=violations, datapoints=datapoints,
                                details=details, message=message, recommendation=recommendation)


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """A growing footprint: no time at stake (it is a risk of running out of memory, not time lost)."""
    if not r.fired:
        return []
    flagged = GPUMemoryIncreaseDetails.from_json(r.details).flagged_windows
    total, windows = (flagged.total, flagged.spans()) if flagged is not None else (None, [])
    return [finding(r, s, "memory", "GPU memory kept growing: the job may run out of GPU memory", None,
                    Where(flagged.nodes if flagged is not None else [], windows=windows[:LISTED_WINDOWS]),
                    {"flagged_windows": total}, severity=MEDIUM)]
