"""Node comparison (multi-node runs only): each node's median CPU, GPU, memory, I/O wait, network and training
step time side by side, from the rules' results, and the node that stands out from the others. In synchronous
data-parallel training the slowest node sets everyone's pace, so one odd node costs the whole cluster."""

from __future__ import annotations

from typing import Any


from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.nodes import STEP, USAGE
from stallwatch.present import charts
from stallwatch.present.report.model import GOOD, WARN, Chart, NotApplicable, Paragraph, Section, Table, Verdict
from stallwatch.units import format_value

INTRO = ("Each node's median over the whole job, side by side: utilization from the system metrics, and the median "
         "duration of its ranks' training steps. In synchronous data-parallel training every node waits for the "
         "slowest at each gradient exchange, so one node that differs (busier CPUs, idle GPUs, slower steps) holds "
         "the whole cluster back. A value is flagged when it is at least 15 percentage points (I/O wait: 10) away "
         "from the median of all nodes, or when its step time differs from that median by more than 15 % (network "
         "rate: 1.5×); with two nodes, each is compared with the other.")


def _fmt(v: float, unit: str) -> str:
    return format_value(v, unit)


def build(analysis: RunAnalysis) -> list[Section]:
    nodes = list(analysis.nodes)
    if len(nodes) < 2:
        return []
    section = Section("nodes", "Node comparison", [Paragraph(INTRO)])
    comparison = analysis.node_comparison
    table = comparison.medians
    if not table:
        section.blocks.append(NotApplicable("Neither system metrics nor training steps were recorded, so the nodes "
                                            "cannot be compared."))
        return [section]
    columns = comparison.columns
    flags: dict[str, list[str]] = {}
    for odd in comparison.oddities:
        col = odd.column
        where = " on the other node" if odd.against_other_node else " (median of all nodes)"
        flags.setdefault(odd.node, []).append(f"{col.label} median {_fmt(odd.value, col.unit)} against "
                                              f"{_fmt(odd.reference, col.unit)}{where}")
    rows = [[node] + [table[c.label].get(node) for c in columns] + ["; ".join(flags.get(node, [])) or "-"]
            for node in nodes]
    section.blocks.append(Table(["Node"] + [f"{c.label} median ({c.unit})" for c in columns] + ["Stands out"],
                                [[_round(v) for v in row] for row in rows], "Per-node medians over the whole job"))
    if flags:
        for node, what in flags.items():
            section.blocks.append(Verdict(
                f"Node {node} differs from the other nodes: {'; '.join(what)}. "
                "If the job synchronizes across nodes, the others wait for it: check its hardware and drivers, its "
                "data path (local disk, network share) and whatever else runs on it.", WARN))
    else:
        section.blocks.append(Verdict("The nodes behave alike: no node's median utilization or step time stands out "
                                      "from the others.", GOOD))
    bars = []
    for col in (STEP, USAGE["GPU"], USAGE["CPU"]):
        if col.label in table:
            values = table[col.label]
            shown = [n for n in nodes if n in values]
            bars.append(charts.bars(shown, [values[n] for n in shown], title=f"{col.label}: median per node",
                                    y_label=col.unit, highlight=comparison.odd_nodes(col)))
    model = bars[0] if len(bars) == 1 else charts.grid(bars)
    section.blocks.append(Chart(model, "Medians per node (a node that stands out in red)"))
    return [section]


def _round(v: Any) -> Any:
    return round(v, 2) if isinstance(v, float) else v
