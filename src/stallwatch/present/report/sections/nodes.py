"""Node comparison (multi-node runs only): each node's median CPU, GPU, memory, I/O wait, network and training
step time side by side, from the rules' results, and the node that stands out from the others. In synchronous
data-parallel training the slowest node sets everyone's pace, so one odd node costs the whole cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from bokeh.layouts import gridplot

from stallwatch.present import charts
from stallwatch.present.report.model import GOOD, WARN, Chart, NotApplicable, Paragraph, Section, Table, Verdict
from stallwatch.records import TRAIN


@dataclass(frozen=True)
class Column:
    """One compared quantity: where its per-node median comes from and what difference counts as odd."""
    label: str
    unit: str
    points: float | None = None  # odd when this many units away from the other nodes' median (percentages)
    ratio: float | None = None  # odd when this many times above or below it (times, rates)


USAGE = {"CPU": Column("CPU", "%", points=15), "GPU": Column("GPU", "%", points=15),
         "CPU memory": Column("CPU memory", "%", points=15), "GPU memory": Column("GPU memory", "%", points=15),
         "I/O": Column("I/O wait", "%", points=10), "Network": Column("Network", "MB/s", ratio=1.5)}
STEP = Column("Training step", "ms", ratio=1.15)

INTRO = ("Each node's median over the whole job, side by side: utilization from the system metrics, and the median "
         "duration of its ranks' training steps. In synchronous data-parallel training every node waits for the "
         "slowest at each gradient exchange, so one node that differs (busier CPUs, idle GPUs, slower steps) holds "
         "the whole cluster back. A value is flagged when it is at least 15 percentage points (I/O wait: 10) away "
         "from the median of all nodes, or when its step time differs from that median by more than 15 % (network "
         "rate: 1.5×); with two nodes, each is compared with the other.")


def medians(rules: dict[str, dict[str, Any]], nodes: list[str]) -> dict[str, dict[str, float]]:
    """column label -> node -> median, from OverallSystemUsage (p50 per node) and StepOutlier (median over the
    node's ranks of their TRAIN steps' p50)."""
    out: dict[str, dict[str, float]] = {}
    usage = (rules.get("OverallSystemUsage") or {}).get("Details") or {}
    for metric, col in USAGE.items():
        per_node = usage.get(metric) or {}
        values = {n: float(per_node[n]["p50"]) for n in nodes if isinstance(per_node.get(n), dict)
                  and per_node[n].get("p50") is not None}
        if metric == "Network":
            values = {n: v / 1e6 for n, v in values.items()}
        if values:
            out[col.label] = values
    steps = ((rules.get("StepOutlier") or {}).get("Details") or {}).get("step_details") or {}
    per_rank: dict[str, list[float]] = {}
    for entry in steps.values():
        if entry.get("phase") == TRAIN and (entry.get("step_stats") or {}).get("p50") is not None:
            per_rank.setdefault(str(entry.get("node")), []).append(1000.0 * float(entry["step_stats"]["p50"]))
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


def _fmt(v: float, unit: str) -> str:
    return f"{v:.3g} {unit}" if abs(v) < 100 else f"{v:.0f} {unit}"


def build(ctx: Any) -> list[Section]:
    nodes = list(ctx.nodes)
    if len(nodes) < 2:
        return []
    section = Section("nodes", "Node comparison", [Paragraph(INTRO)])
    table = medians(ctx.rules, nodes)
    if not table:
        section.blocks.append(NotApplicable("Neither system metrics nor training steps were recorded, so the nodes "
                                            "cannot be compared."))
        return [section]
    columns = [c for c in (*USAGE.values(), STEP) if c.label in table]
    flags: dict[str, list[str]] = {}
    for col in columns:
        for node, others in odd_ones(table[col.label], col).items():
            v = table[col.label][node]
            where = " on the other node" if len(table[col.label]) == 2 else " (median of all nodes)"
            flags.setdefault(node, []).append(f"{col.label} median {_fmt(v, col.unit)} against "
                                              f"{_fmt(others, col.unit)}{where}")
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
                                    y_label=col.unit, highlight=set(odd_ones(values, col))))
    model = bars[0] if len(bars) == 1 else gridplot(bars, ncols=len(bars), sizing_mode="stretch_width",
                                                     toolbar_location=None)
    section.blocks.append(Chart(model, "Medians per node (a node that stands out in red)"))
    return [section]


def _round(v: Any) -> Any:
    return round(v, 2) if isinstance(v, float) else v
