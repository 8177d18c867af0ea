"""5. GPU memory: GPUMemoryIncrease's box plots of each GPU's memory utilization per node, its largest
window-to-window rises and the verdict on a growing footprint."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.rules.gpu_memory_increase import GpuMemory, GPUMemoryIncreaseDetails
from stallwatch.present.report.model import Chart, Paragraph, Section, Table
from stallwatch.present.report.sections import _loop_charts as charts
from stallwatch.present.report.sections._loop import num, plural, rule_verdict, rule_view, skipped_nodes, when

RULE = "GPUMemoryIncrease"
TITLE = "GPU memory"
NEAR_FULL = 90.0  # % of memory: a footprint this high leaves no room to grow


def build(analysis: RunAnalysis) -> list[Section]:
    sec = Section("gpu-memory", TITLE, level=3)
    view, missing = rule_view(analysis, RULE, "the GPU memory analysis")
    if missing is not None:
        sec.blocks.append(missing)
        return [sec]
    assert view is not None
    p = view.parameters
    inc = float(p.get("increase") or 0)
    sec.blocks.append(Paragraph(
        "The GPUMemoryIncrease rule helps to detect large increases in memory usage on GPUs. It computed the mean "
        f"memory utilization of each GPU over consecutive windows of {p.get('window')} snapshots and checked "
        f"whether it rose by more than {num(inc)} percentage points from one window to the next: had it risen, "
        f"for instance, from 10 % to more than {num(10 + inc)} %, the rule would have fired. During initialization "
        f"memory use is likely to change a lot, so the rule skipped the first {p.get('patience')} snapshots of each "
        f"node. It found {plural(view.violations, 'such rise')}, analyzed {view.datapoints} snapshots and fired in "
        f"{plural(view.triggered, 'window')}."))
    if skipped_nodes(view):
        sec.blocks.append(Paragraph(skipped_nodes(view)))
    details = GPUMemoryIncreaseDetails.from_json(view.details)
    for node, gpus in details.nodes.items():
        sec.blocks.append(_table(node, gpus))
        boxes = [(g, box) for g, e in gpus.items() if (box := e.box()) is not None]
        if boxes:
            sec.blocks.append(Chart(charts.box_plot(f"GPU memory on node {node}", boxes,
                                                    y_label="Memory utilization in %"),
                                    caption=f"Memory utilization per GPU on node {node} (whiskers at most 1.5 IQR "
                                            "beyond the box, without outliers)"))
    last = details.last_timestamp
    sec.blocks.append(rule_verdict(
        view, f"The GPU memory footprint grew: {plural(view.violations, 'rise')} of more than {num(inc)} points, the "
        f"last at {when(last)}.",
        f"No GPU's memory footprint rose by more than {num(inc)} points from one window to the next."))
    return [sec]


def _table(node: str, gpus: dict[str, GpuMemory]) -> Table:
    rows = [[g, e.gpu_max, e.p95, e.p50, e.p05, e.increase, e.violations,
             when(e.last_timestamp) if e.last_timestamp is not None else "", _note(e)]
            for g, e in gpus.items()]
    return Table(["GPU", "Max %", "p95 %", "p50 %", "p5 %", "Largest rise [points]", "Rises", "Last rise", "Note"],
                 rows, caption=f"GPU memory utilization on node {node}")


def _note(e: GpuMemory) -> str:
    """The seeds' remarks on one GPU: close to full, little used, or fluctuating."""
    top, p95, p5 = e.gpu_max, e.p95, e.p05
    if top is not None and top >= NEAR_FULL:
        return f"close to full (peak {num(top, 0)} %): a larger GPU or a smaller footprint leaves room to grow"
    if p95 is not None and p5 is not None and p95 - p5 > 50:
        return f"fluctuating a lot (p5 {num(p5, 0)} %, p95 {num(p95, 0)} %)"
    if p95 is not None and p95 < 50:
        return f"lightly used (p95 only {num(p95, 0)} %)"
    return ""
