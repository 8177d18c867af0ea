"""LoadBalancing (RULES.md): GPUs of one node whose utilization histograms differ (Jensen-Shannon distance)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallwatch.analyze.finding import MEDIUM, Finding, Where, finding
from stallwatch.analyze.rules.base import Chunk, Rule, RuleResult
from stallwatch.analyze.rules.kit.checks import check_counts, listing, plain_float, skip_patience
from stallwatch.analyze.rules.kit.details import DetailsRecord, rest
from stallwatch.analyze.rules.kit.windows import (
    all_not_applicable,
    device_of,
    gpu_series,
    note_skipped,
    ordered_columns,
    take_node,
)
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import GPU_UTIL


_BINS = 50  # 2 % wide, covering 0–100 % with 100 in the last bin
_BINEDGES = [float(x) for x in np.linspace(0.0, 100.0, _BINS + 1)]


@dataclass(frozen=True)
class BalanceNode(DetailsRecord):
    """One node's entry, Details[node]: each GPU's utilization histogram (snapshot counts over `binedges`, %), the
    Jensen-Shannon distance of each pair (Details[node]["distances"][a][b]), mean utilization (%), the pairs over
    the threshold as [a, b, distance], and the node's GPU count."""

    workloads: dict[str, list[int]] = field(default_factory=dict)
    binedges: list[float] = field(default_factory=list)
    distances: dict[str, dict[str, float]] = field(default_factory=dict)
    mean_utilization: dict[str, float] = field(default_factory=dict)
    imbalanced: list[list[Any]] = field(default_factory=list)
    gpus: int | None = None

    def distance(self, a: str, b: str) -> float | None:
        return self.distances.get(a, {}).get(b, self.distances.get(b, {}).get(a))


@dataclass(frozen=True)
class LoadBalancingDetails(DetailsRecord):
    """LoadBalancing's Details: per node, `nothing_to_compare` when every node had one GPU, and the nodes without
    GPU data."""

    rule = "LoadBalancing"
    nodes: dict[str, BalanceNode] = rest()
    nothing_to_compare: bool = False
    not_applicable: dict[str, str] = field(default_factory=dict)


@dataclass
class _LoadGpu:
    counts: np.ndarray = field(default_factory=lambda: np.zeros(_BINS, np.int64))
    total: float = 0.0  # sum of values, for the mean


@dataclass
class _LoadNode:
    seen: int = 0
    snapshots: int = 0
    has_gpu: bool = False
    gpu_count: int = 0  # GPUs seen, during patience too: a short run of an 8-GPU node is not "one GPU only"
    gpus: dict[str, _LoadGpu] = field(default_factory=dict)


def js_distance(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon distance of two histograms (counts, normalized here), natural log as SageMaker
    (scipy's default): sqrt of the divergence, 0 for equal histograms, at most sqrt(ln 2) ≈ 0.83."""
    p = p / p.sum()
    q = q / q.sum()
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log(a[nz] / m[nz])))

    return math.sqrt(max(0.0, (kl(p) + kl(q)) / 2))


class LoadBalancing(Rule):
    """Per node, a histogram of each GPU's utilization after `patience` (50 bins of 2 %, covering 0–100 %
    inclusive; values outside are clipped into range) and the Jensen–Shannon distance of every pair of
    its GPUs.

    Evaluation points: the pairs of GPUs of a node, judged on their whole-run histograms (counts, so one
    chunk or many give the same); RuleTriggered and Violations both count pairs further apart than
    `threshold`. Datapoints: snapshots after patience of nodes with GPUs. Details[node]: `workloads`
    {gpu: counts per bin}, `binedges`, `distances` {gpuA: {gpuB: d}} for every pair, `mean_utilization`
    {gpu: %}, `imbalanced` [[gpuA, gpuB, d], …], `gpus` (how many it had, counted during patience too); and
    `nothing_to_compare` when every node had one GPU (the rule never judges such a run, however long)."""

    name = "LoadBalancing"
    metrics = (GPU_UTIL,)
    description = ("Detects workload balancing issues across GPUs. Workload imbalance can occur in training jobs "
                   "with data parallelism. The gradients are accumulated on a primary GPU, and this GPU might be "
                   "overused with regard to other GPUs, resulting in reducing the efficiency of data "
                   "parallelization.")
    recommendation = ("Choose a different distributed training strategy or a different distributed training "
                      "framework.")
    defaults = {"threshold": 0.2, "patience": 1000}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "patience")
        self._nodes: dict[str, _LoadNode] = {}

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        for node, frame in chunk.system.items():
            st = self._nodes.setdefault(node, _LoadNode())
            n = len(frame)
            skip = skip_patience(st.seen, n, self.params["patience"])
            st.seen += n
            cols = gpu_series(frame, GPU_UTIL)
            st.has_gpu |= bool(cols) and n > 0
            if n > 0:
                st.gpu_count = max(st.gpu_count, len(cols))
            st.snapshots += n - skip
            if n - skip == 0:
                continue
            for col, x in cols.items():
                v = x[skip:]
                v = v[~np.isnan(v)]
                acc = st.gpus.setdefault(device_of(col), _LoadGpu())
                if v.size:
                    v = np.clip(v, 0.0, 100.0)
                    idx = np.minimum((v * (_BINS / 100.0)).astype(np.int64), _BINS - 1)
                    acc.counts += np.bincount(idx, minlength=_BINS)
                    acc.total += float(v.sum())

    def merge(self, other: Rule, node: str) -> None:
        """Every statistic here is per node and the result orders nodes by name: `node`'s state is taken whole."""
        assert isinstance(other, LoadBalancing)
        take_node(self._nodes, other._nodes, node, lambda st: st.seen)

    def result(self) -> RuleResult:
        nodes = {n: s for n, s in self._nodes.items() if s.has_gpu}
        if not nodes:
            return all_not_applicable(self, self._nodes)
        thr = self.params["threshold"]
        details: dict[str, Any] = {}
        violations = datapoints = 0
        findings: list[str] = []
        single = []
        for node in sorted(nodes):
            st = nodes[node]
            datapoints += st.snapshots
            gpus = [g for g in ordered_columns(st.gpus) if st.gpus[g].counts.sum() > 0]
            means = {g: plain_float(st.gpus[g].total / st.gpus[g].counts.sum(), 2) for g in gpus}
            distances: dict[str, dict[str, float]] = {}
            imbalanced: list[list[Any]] = []
            for i, a in enumerate(gpus):
                for b in gpus[i + 1:]:
                    d = js_distance(st.gpus[a].counts.astype(float), st.gpus[b].counts.astype(float))
                    distances.setdefault(a, {})[b] = round(d, 4)
                    if d > thr:
                        imbalanced.append([a, b, round(d, 4)])
            violations += len(imbalanced)
            if st.gpu_count < 2:
                single.append(node)
            details[node] = {"workloads": {g: st.gpus[g].counts.tolist() for g in gpus}, "binedges": _BINEDGES,
                             "distances": distances, "mean_utilization": means, "imbalanced": imbalanced,
                             "gpus": st.gpu_count}
            for a, b, d in imbalanced:
                findings.append(f"on node {node} {a} and {b} had different workloads (distance {d:.2f} > {thr}; "
                                f"mean utilization {means[a]:.0f} % vs {means[b]:.0f} %)")
        message = note_skipped(details, self._nodes)
        if single:
            message = "; ".join(filter(None, [message, f"one GPU only, nothing to balance: {', '.join(single)}"]))
            if len(single) == len(nodes):
                details["nothing_to_compare"] = True  # however long the run: not a run too short to judge
        recommendation = f"{listing(findings)}. {self.recommendation}" if findings else None
        return self.make_result(triggered=violations, violations=violations, datapoints=datapoints,
                                details=details, message=message, recommendation=recommendation)


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """The nodes with imbalanced pairs of GPUs."""
    if not r.fired:
        return []
    d = LoadBalancingDetails.from_json(r.details)
    nodes = sorted(n for n, e in d.nodes.items() if e.imbalanced)
    pairs = [p for n in nodes for p in d.nodes[n].imbalanced]
    return [finding(r, s, "gpus", f"GPUs of {'node ' + nodes[0] if len(nodes) == 1 else 'several nodes'} had uneven "
                                  "workloads", None, Where(nodes), {"imbalanced_pairs": pairs[:20]},
                    severity=MEDIUM)]
