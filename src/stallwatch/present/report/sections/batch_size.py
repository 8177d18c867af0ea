"""5. Batch size: BatchSize's box plots of total CPU, GPU utilization and GPU memory per node, and whether
the windows it evaluated showed all three low (a batch too small for the instance)."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.rules.batch_size import BatchNode, BatchSizeDetails
from stallwatch.analyze.rules.kit.details import BoxStats
from stallwatch.present.report.model import Chart, Paragraph, Section, Table
from stallwatch.present.report.sections import _loop_charts as charts
from stallwatch.present.report.sections._loop import rule_verdict, rule_view, skipped_nodes, when

RULE = "BatchSize"
TITLE = "Batch size"


def build(analysis: RunAnalysis) -> list[Section]:
    sec = Section("batch-size", TITLE, level=3)
    view, missing = rule_view(analysis, RULE, "the batch size analysis")
    if missing is not None:
        sec.blocks.append(missing)
        return [sec]
    assert view is not None
    p = view.parameters
    sec.blocks.append(Paragraph(
        "The BatchSize rule helps to detect if the GPUs are underutilized because the batch size is too small. To "
        "detect this, it analyzes the CPU utilization, the GPU utilization and the GPU memory footprint. Over "
        f"windows of {p.get('window')} consecutive snapshots, the rule checked whether the 95th percentile of the "
        f"total CPU utilization was below cpu_threshold_p95 of {p.get('cpu_threshold_p95')} % while, for some GPU, "
        f"the 95th percentile of its utilization was below gpu_threshold_p95 of {p.get('gpu_threshold_p95')} % "
        f"and the 95th percentile of its memory utilization below gpu_memory_threshold_p95 of "
        f"{p.get('gpu_memory_threshold_p95')} %. In your training job this happened in {view.violations} windows. "
        f"The rule skipped the first {p.get('patience')} snapshots of each node and analyzed {view.datapoints} "
        "snapshots."))
    if skipped_nodes(view):
        sec.blocks.append(Paragraph(skipped_nodes(view)))
    details = BatchSizeDetails.from_json(view.details)
    for node, entry in details.nodes.items():
        series = [(key, stats) for key, stats in entry.series.items() if stats.as_box()]
        if not series:
            continue
        sec.blocks.append(Chart(charts.box_plot(f"Node {node}", [(_label(k), s.as_box()) for k, s in series]),
                                caption=f"Total CPU, GPU utilization and GPU memory utilization on node {node} "
                                        "(whiskers at most 1.5 IQR beyond the box, without outliers)"))
        sec.blocks.append(_table(node, entry, series))
    last = details.last_timestamp
    sec.blocks.append(rule_verdict(
        view, f"Your training job is underutilizing the instance: CPU, GPU and GPU memory usage were all low in "
        f"{view.violations} windows, the last ending at {when(last)}.",
        "In no window were the CPU, a GPU and its memory all lightly used: the batch size suits the instance."))
    return [sec]


def _label(key: str) -> str:
    if key == "cpu":
        return "CPU (total)"
    return f"{key[:-len('_memory')]} memory" if key.endswith("_memory") else key


def _table(node: str, entry: BatchNode, series: list[tuple[str, BoxStats]]) -> Table:
    rows = [[_label(k), s.p95, s.p75, s.p50, s.p25, s.upper, s.lower]
            for k, s in series]
    return Table(["Series", "p95 %", "p75 %", "p50 %", "p25 %", "Upper whisker %", "Lower whisker %"], rows,
                 caption=f"Node {node}: {entry.violations} of {entry.windows} windows flagged")
