"""Node comparison for multi-node runs: each node's median CPU, GPU, memory, I/O wait, network and training
step time side by side (from the rules' results), and the nodes that stand out. In synchronous data-parallel
training the slowest node sets everyone's pace, so one odd node costs the whole cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from stallwatch import catalogue, units
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.step_outlier import StepOutlierDetails
from stallwatch.analyze.rules.system_usage import OverallSystemUsageDetails
from stallwatch.records import TRAIN


@dataclass(frozen=True)
class Column:
    """One compared quantity: what difference counts as odd."""
    label: str
    unit: str
    points: float | None = None  # odd when this many units away from the other nodes' median (percentages)
    ratio: float | None = None  # odd when this many times above or below it (times, rates)


USAGE = {"CPU": Column("CPU", "%", points=15), "GPU": Column("GPU", "%", points=15),
         "CPU memory": Column("CPU memory", "%", points=15), "GPU memory": Column("GPU memory", "%", points=15),
         "I/O": Column(catalogue.metric("cpu", "cpu_iowait").label, "%", points=10),  # type: ignore[union-attr]
         "Network": Column("Network", units.axis(catalogue.NETWORK_TOTAL.unit)[0], ratio=1.5)}
STEP = Column("Training step", "ms", ratio=1.15)


@dataclass(frozen=True)
class Oddity:
    """A node whose median differs from what it is compared with (the median of all nodes; with two nodes,
    the other one)."""
    node: str
    column: Column
    value: float
    reference: float
    against_other_node: bool


@dataclass(frozen=True)
class NodeComparison:
    nodes: list[str]
    columns: list[Column]
    medians: dict[str, dict[str, float]]  # column label -> node -> median
    oddities: list[Oddity]

    def odd_nodes(self, column: Column) -> set[str]:
        return {o.node for o in self.oddities if o.column == column}


def compare_nodes(rules: Mapping[str, RuleResult], nodes: list[str]) -> NodeComparison:
    table = medians(rules, nodes)
    columns = [c for c in (*USAGE.values(), STEP) if c.label in table]
    oddities = []
    for col in columns:
        values = table[col.label]
        for node, ref in odd_ones(values, col).items():
            oddities.append(Oddity(node, col, values[node], ref, len(values) == 2))
    return NodeComparison(nodes, columns, table, oddities)


def medians(rules: Mapping[str, RuleResult], nodes: list[str]) -> dict[str, dict[str, float]]:
    """column label -> node -> median, from OverallSystemUsage (p50 per node) and StepOutlier (median over the
    node's ranks of their TRAIN steps' p50)."""
    out: dict[str, dict[str, float]] = {}
    usage_result = rules.get("OverallSystemUsage")
    usage = OverallSystemUsageDetails.from_json(usage_result.details if usage_result is not None else {})
    for metric, col in USAGE.items():
        per_node = usage.metric(metric)
        values = {n: float(p50) for n in nodes if n in per_node and (p50 := per_node[n].p50) is not None}
        if metric == "Network":
            values = {n: v / 1e6 for n, v in values.items()}
        if values:
            out[col.label] = values
    outliers = rules.get("StepOutlier")
    steps = StepOutlierDetails.from_json(outliers.details if outliers is not None else {}).series
    per_rank: dict[str, list[float]] = {}
    for entry in steps.values():
        if entry.phase == TRAIN and entry.step_stats.p50 is not None:
            per_rank.setdefault(entry.node, []).append(1000.0 * float(entry.step_stats.p50))
    if per_rank:
        out[STEP.label] = {n: float(np.median(v)) for n, v in per_rank.items() if n in nodes}
    return out


def odd_ones(values: dict[str, float], col: Column) -> dict[str, float]:
    """Nodes far from the others: node -> what it is compared with (the median of all nodes; with two nodes,
    the other one, so both are named when they differ)."""
    out: dict[str, float] = {}
    if len(values) < 2:
        return out
    middle = float(np.median(list(values.values())))
    for node, v in values.items():
        ref = next(x for n, x in values.items() if n != node) if len(values) == 2 else middle
        if col.points is not None and abs(v - ref) >= col.points:
            out[node] = ref
        elif col.ratio is not None and min(v, ref) > 0 and max(v, ref) / min(v, ref) >= col.ratio:
            out[node] = ref
        elif col.ratio is not None and min(v, ref) <= 0 < max(v, ref):
            out[node] = ref
    return out
