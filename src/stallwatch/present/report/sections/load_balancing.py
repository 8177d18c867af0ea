"""5. Workload balancing: LoadBalancing's histogram of each GPU's utilization per node and the distances
between them, with the pairs it found imbalanced."""

from __future__ import annotations

from typing import Any

import numpy as np

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.rules.load_balancing import BalanceNode, LoadBalancingDetails
from stallwatch.present.report.model import INFO, WARN, Chart, Paragraph, Section, Table, Verdict
from stallwatch.present.report.sections import _loop_charts as charts
from stallwatch.present.report.sections._loop import num, rule_verdict, rule_view, skipped_nodes

RULE = "LoadBalancing"
TITLE = "Workload balancing"


def build(analysis: RunAnalysis) -> list[Section]:
    sec = Section("workload-balancing", TITLE, level=3)
    view, missing = rule_view(analysis, RULE, "the workload balancing analysis")
    if missing is not None:
        sec.blocks.append(missing)
        return [sec]
    assert view is not None
    threshold = view.parameters.get("threshold")
    sec.blocks.append(Paragraph(
        "The LoadBalancing rule helps to detect issues in workload balancing between multiple GPUs. It computes a "
        "histogram of the utilization of each GPU and compares the histograms of every two GPUs of a node with "
        "the Jensen-Shannon distance (0 for identical workloads, at most 0.83). The rule checked whether any "
        f"distance was larger than the threshold of {threshold}. During initialization utilization is likely zero, "
        f"so the rule skipped the first {view.parameters.get('patience')} snapshots of each node. It analyzed "
        f"{view.datapoints} snapshots and found {view.violations} imbalanced pairs of GPUs."))
    if skipped_nodes(view):
        sec.blocks.append(Paragraph(skipped_nodes(view)))
    nodes = LoadBalancingDetails.from_json(view.details).nodes
    single = [n for n, d in nodes.items() if _gpus(d) < 2]
    for node, d in nodes.items():
        sec.blocks += _node(node, d, threshold)
    if len(single) == len(nodes):
        which = f"Node {single[0]} used" if len(single) == 1 else f"Nodes {', '.join(single)} each used"
        sec.blocks.append(Verdict(f"{which} one GPU only, so there is no workload to balance.", INFO))
        return [sec]
    if single:
        sec.blocks.append(Paragraph(f"One GPU only, nothing to balance, on: {', '.join(single)}."))
    fine = f"The GPUs of each node had similar workloads (every distance at most {threshold})."
    sec.blocks.append(rule_verdict(view, "Workloads differed between GPUs:", fine))
    return [sec]


def _node(node: str, d: BalanceNode, threshold: Any) -> list[Any]:
    workloads, edges, means = d.workloads, d.binedges, d.mean_utilization
    blocks: list[Any] = []
    series = []
    for gpu, counts in workloads.items():
        c = np.asarray(counts, dtype=np.float64)
        if c.sum() > 0:
            series.append((gpu, (c / c.sum()).tolist(), edges))
    if series:
        blocks.append(Chart(charts.histogram(f"Workloads on node {node}", "GPU utilization in %", series,
                                             y_label="Share of snapshots", x_range=(0.0, 100.0)),
                            caption=f"Utilization histogram per GPU on node {node} (click a GPU in the legend to "
                                    "hide it)"))
    gpus = list(workloads)
    if len(gpus) >= 2:
        rows = []
        for a in gpus:
            cells = [0.0 if a == b else d.distance(a, b) for b in gpus]
            rows.append([a, means.get(a), *cells])
        blocks.append(Table(["GPU", "Mean utilization %", *gpus], rows,
                            caption=f"Distances between the GPUs' workloads on node {node}"))
    imbalanced = d.imbalanced
    if imbalanced:
        pairs = "; ".join(f"{a} and {b}: {num(dist)} (mean utilization {num(means.get(a), 0)} % vs "
                          f"{num(means.get(b), 0)} %)" for a, b, dist in imbalanced)
        blocks.append(Verdict(f"The rule identified workload balancing issues on node {node}, where workloads "
                              f"differed by more than the threshold of {threshold}: {pairs}.", WARN))
    return blocks


def _gpus(detail: BalanceNode) -> int:
    """The node's GPUs: counted by the rule (during its start-up skip too), else those with a histogram."""
    return detail.gpus if detail.gpus is not None else len(detail.workloads)

