"""5. GPU utilization: LowGPUUtilization's verdict per GPU, and box plots of each GPU's utilization per node
from the rule's whole-run statistics (the snapshots after its patience)."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.low_gpu_utilization import GpuUtilization, LowGPUUtilizationDetails
from stallwatch.present.report.model import Chart, Paragraph, Section, Table
from stallwatch.present.report.sections import _loop_charts as charts
from stallwatch.present.report.sections._loop import num, rule_verdict, rule_view, skipped_nodes, when

RULE = "LowGPUUtilization"
TITLE = "GPU utilization"


def build(analysis: RunAnalysis) -> list[Section]:
    sec = Section("gpu-utilization", TITLE, level=3)
    view, missing = rule_view(analysis, RULE, "the GPU utilization analysis")
    if missing is not None:
        sec.blocks.append(missing)
        return [sec]
    assert view is not None
    sec.blocks.append(Paragraph(_intro(view)))
    if skipped_nodes(view):
        sec.blocks.append(Paragraph(skipped_nodes(view)))
    patience = int(view.parameters.get("patience") or 0)
    details = LowGPUUtilizationDetails.from_json(view.details)
    for node, gpus in details.nodes.items():
        sec.blocks.append(_table(node, gpus, view))
        boxes = gpu_boxes(gpus)
        if boxes:
            after = f"after its first {patience} snapshots"
            sec.blocks.append(Chart(charts.box_plot(f"GPU utilization on node {node}", boxes),
                                    caption=f"Utilization per GPU on node {node} ({after}; whiskers at most 1.5 "
                                            "IQR beyond the box, without outliers)"))
    sec.blocks.append(rule_verdict(
        view, _fired_text(details), f"Every GPU stayed busy: no window had a p95 of utilization below "
        f"{view.parameters.get('threshold_p95')} % or fluctuated below {view.parameters.get('threshold_p5')} %."))
    return [sec]


def gpu_boxes(gpus: dict[str, GpuUtilization]) -> list[tuple[str, dict[str, float]]]:
    """Box-plot statistics of each GPU's utilization, as LowGPUUtilization computed them over every snapshot it
    evaluated (after its patience); GPUs it evaluated no snapshot of are left out."""
    return [(gpu, box) for gpu, g in gpus.items() if (box := g.box()) is not None]


def _intro(view: RuleResult) -> str:
    p = view.parameters
    gpus = LowGPUUtilizationDetails.from_json(view.details).gpus()
    under, fluct = sum(g.underutilized for g in gpus), sum(g.fluctuating for g in gpus)
    return (f"The LowGPUUtilization rule checks for low and fluctuating GPU usage. If the GPU usage is consistently "
            f"low, it might be caused by bottlenecks or a small batch size. If usage is heavily fluctuating, it can be "
            f"due to bottlenecks or blocking calls. The rule computed the 95th and 5th percentile of each GPU's "
            f"utilization over windows of {p.get('window')} consecutive snapshots: it found {under} windows where "
            f"p95 was below {p.get('threshold_p95')} % (underutilized) and {fluct} where p95 was above "
            f"{p.get('threshold_p95')} % and p5 below {p.get('threshold_p5')} % (fluctuating). During "
            f"initialization the GPU usage is likely zero, so the rule skipped the first {p.get('patience')} "
            f"snapshots of each node. The rule analyzed {view.datapoints} snapshots and fired in {view.triggered} "
            f"windows.")


def _table(node: str, gpus: dict[str, GpuUtilization], view: RuleResult) -> Table:
    rows = []
    for gpu, g in gpus.items():
        rows.append([gpu, g.gpu_max, g.gpu_95, g.gpu_5, g.p50, g.windows, g.underutilized, g.fluctuating,
                     _gpu_verdict(g), when(g.last_timestamp) if g.last_timestamp is not None else ""])
    return Table(["GPU", "Max %", "p95 %", "p5 %", "Median %", "Windows", "Underutilized", "Fluctuating", "Verdict",
                  "Last flagged"], rows, caption=f"GPU utilization on node {node}")


def _gpu_verdict(g: GpuUtilization) -> str:
    p95, p5 = g.gpu_95, g.gpu_5
    if g.case == "underutilized":
        return f"underutilized (p95 down to {num(g.lowest_window_p95, 0)} % in a window)"
    if g.case == "fluctuating":
        return f"fluctuating (p5 down to {num(g.lowest_window_p5, 0)} % in a window)"
    if p95 is not None and p5 is not None and p95 - p5 > 50:
        return f"well used, but spread widely over the run (p5 {num(p5, 0)} %, p95 {num(p95, 0)} %)"
    return "well used" if p95 is not None else "no data after patience"


def _fired_text(details: LowGPUUtilizationDetails) -> str:
    under = any(g.underutilized for g in details.gpus())
    text = ("Your training job is underutilizing the instance: consider a smaller instance type or a larger batch "
            "size. " if under else "GPU utilization fluctuated: look for bottlenecks and blocking calls. ")
    return text + f"The rule last fired at {when(details.last_timestamp)}."
