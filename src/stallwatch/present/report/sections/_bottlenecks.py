"""CPU and I/O bottlenecks, one presentation for both rules: the seeds' text with the right counts, the pie of
low-GPU snapshots (with the seeds' wrong subtraction fixed), the longest bottleneck periods, and what the
training loop was doing during them (the rule's framework context)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stallwatch import catalogue
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.rules.bottleneck import BottleneckDetails, BottleneckNode, BottleneckRange
from stallwatch.present.charts import row
from stallwatch.present.report.model import Chart, Paragraph, Section, Table
from stallwatch.present.report.sections import _loop_charts as charts
from stallwatch.present.report.sections._loop import (
    duration,
    num,
    percent,
    rule_verdict,
    rule_view,
    skipped_nodes,
    when,
)
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, OPTIMIZER, STEP

PERIODS_LISTED = 10
PARTS = {k: catalogue.label(k) for k in (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE)}
REST_OF_STEPS, OUTSIDE_STEPS = "rest of the steps", catalogue.label("outside")


@dataclass(frozen=True)
class Kind:
    """What differs between the CPU and the I/O presentation."""
    rule: str
    title: str
    id: str
    what: str  # "CPU", "I/O"
    busy_param: str  # the per-core threshold parameter
    busy: str  # "the utilization of a CPU core", …


def build(analysis: RunAnalysis, kind: Kind) -> list[Section]:
    sec = Section(kind.id, kind.title, level=3)
    view, missing = rule_view(analysis, kind.rule, f"the {kind.what} bottleneck analysis")
    if missing is not None:
        sec.blocks.append(missing)
        return [sec]
    assert view is not None
    p, d = view.parameters, BottleneckDetails.from_json(view.details)
    b = d.bottlenecks
    nodes = d.nodes
    count, share = b.count, float(b.percent)
    above = {n: float(e.percent or 0.0) for n, e in nodes.items() if e.above_threshold}
    if len(nodes) > 1:
        where = (f"On {_listed(above)} the share was above the threshold of {p.get('threshold')} %; on the other "
                 "nodes below it." if above else f"On every node the share was below the threshold of "
                 f"{p.get('threshold')} %.")
    else:
        where = f"This is {'above' if above else 'below'} the threshold of {p.get('threshold')} %."
    sec.blocks.append(Paragraph(
        f"The {kind.rule} rule checked when {kind.busy} was above {kind.busy_param} of {p.get(kind.busy_param)} % "
        f"while a GPU's utilization was below gpu_threshold of {p.get('gpu_threshold')} %. During initialization "
        f"utilization is likely to be zero, so the rule skipped the first {p.get('patience')} snapshots of each "
        f"node. With this configuration the rule found {count} {kind.what} bottlenecks, which is {num(share, 1)} % "
        f"of the time analyzed. {where} The rule analyzed {view.datapoints} snapshots and fired at "
        f"{view.triggered} of them (each snapshot at which the node's share of bottlenecks so far exceeded the "
        "threshold)."))
    if skipped_nodes(view):
        sec.blocks.append(Paragraph(skipped_nodes(view)))
    if len(nodes) > 1:
        sec.blocks.append(_nodes_table(nodes, kind))
    low = d.low_gpu_utilization
    if low:
        sec.blocks += _low_gpu(view.datapoints, low, count, kind, p.get("gpu_threshold"))
    ranges = b.ranges
    if ranges:
        sec.blocks.append(_periods_table(analysis, ranges, b.ranges_total or len(ranges), kind))
        context = framework_during(d, b.ranges_total or len(ranges))
        if context is not None:
            sec.blocks += _context_blocks(context, kind, b.ranges_total or len(ranges))
    if above:  # the rule's recommendation names the nodes, their shares and what to do
        fired = ""
    else:  # fired while the share so far was high (early in the run), below the threshold over the whole run
        fired = (f"{kind.what} bottlenecks exceeded {p.get('threshold')} % of the time so far at {view.triggered} "
                 f"snapshots, though over the whole run they were {num(share, 1)} %.")
    fine = (f"{kind.what} bottlenecks were rare ({num(share, 1)} % of the time, threshold {p.get('threshold')} %)."
            if count else f"No {kind.what} bottlenecks.")
    sec.blocks.append(rule_verdict(view, fired, fine))
    return [sec]


def _listed(shares: dict[str, float]) -> str:
    """ "node algo-2 (51.7 % of the time)", joined."""
    return ", ".join(f"node {n} ({num(v, 1)} % of the time)" for n, v in shares.items())


def _nodes_table(nodes: dict[str, BottleneckNode], kind: Kind) -> Table:
    rows = [[node, e.datapoints, e.low_gpu_utilization, e.bottlenecks, e.percent, "yes" if e.above_threshold else "no",
             e.ranges] for node, e in nodes.items()]
    return Table(["Node", "Snapshots", "Low GPU", f"{kind.what} bottlenecks", "% of snapshots", "Above threshold",
                  "Periods"], rows, caption=f"{kind.what} bottlenecks per node")


def _low_gpu(datapoints: int, low: int, count: int, kind: Kind, gpu_threshold: Any) -> list[Any]:
    """The seeds' pie, with each snapshot counted once: GPU busy / GPU low without a bottleneck / bottleneck."""
    slices = {"GPU usage above threshold": datapoints - low,
              f"GPU usage below threshold, no {kind.what} bottleneck": low - count,
              f"Low GPU usage due to {kind.what} bottlenecks": count}
    text = (f"The following chart shows how many snapshots had a GPU below the gpu_threshold of {gpu_threshold} % "
            f"and how many of those were likely caused by a {kind.what} bottleneck. The rule found {low} out of "
            f"{datapoints} snapshots with a GPU below {gpu_threshold} %; {num(percent(count, low), 1)} % of those "
            f"were likely caused by {kind.what} bottlenecks.")
    return [Paragraph(text), Chart(charts.pie(f"Low GPU usage caused by {kind.what} bottlenecks", slices,
                                              unit="snapshots"),
                                   caption="Snapshots analyzed, by GPU usage and bottleneck")]


def _periods_table(analysis: RunAnalysis, ranges: list[BottleneckRange], total: int, kind: Kind) -> Table:
    longest = sorted(ranges, key=lambda r: (-r.snapshots, r.start_us))[:PERIODS_LISTED]
    rows = []
    for r in longest:
        end = r.end_us + int(1000 * analysis.sample_interval_ms.get(r.node, 0.0))  # the last snapshot's period
        rows.append([r.node, when(r.start_us), when(end), r.snapshots, duration((end - r.start_us) / 1e6)])
    among = f" (among the first {len(ranges)} of {total} periods)" if total > len(ranges) else ""
    return Table(["Node", "From", "To", "Snapshots", "Duration"], rows,
                 caption=f"The longest {kind.what} bottleneck periods{among}")


# ---------------------------------------------------------------------------------------------------
# What the training loop was doing during the bottleneck periods


@dataclass
class LoopContext:
    """Rank-seconds of the training loop inside the bottleneck periods: per phase of its steps (TRAIN, EVAL,
    GLOBAL, outside steps) and per part (waiting for data, forward, …, rest of the steps, outside steps)."""
    rank_seconds: float
    periods: int
    phases: dict[str, float] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)


def framework_during(details: BottleneckDetails, periods: int) -> LoopContext | None:
    """The rule's framework context (every bottleneck period of every node, matched with the events as they
    arrived), summed over nodes; None when no event fell in a period."""
    per_node = details.framework_context
    out = LoopContext(0.0, periods)
    parts = {label: 0.0 for label in PARTS.values()}
    phases: dict[str, float] = {}
    in_steps = 0.0
    for c in per_node.values():
        out.rank_seconds += float(c.bottleneck_s) * c.ranks
        kinds = c.kinds_s
        for k, label in PARTS.items():
            parts[label] += float(kinds.get(k) or 0.0)
        for mode, seconds in c.phases_s.items():
            phases[mode] = phases.get(mode, 0.0) + float(seconds)
        in_steps += float(kinds.get(STEP) or 0.0)
    if in_steps == 0 and not any(parts.values()):
        return None
    parts[REST_OF_STEPS] = max(in_steps - sum(parts.values()), 0.0)
    parts[OUTSIDE_STEPS] = max(out.rank_seconds - in_steps, 0.0)
    phases[OUTSIDE_STEPS] = max(out.rank_seconds - in_steps, 0.0)
    out.phases = {k: v for k, v in phases.items() if v > 0}
    out.parts = {k: v for k, v in parts.items() if v > 0}
    return out


def _context_blocks(c: LoopContext, kind: Kind, total: int) -> list[Any]:
    among = f" the {total} bottleneck periods" if total > 1 else " the bottleneck period"
    top = max(c.parts.items(), key=lambda kv: kv[1]) if c.parts else None
    text = (f"What the training loop was doing during{among}, from its framework events (time of all ranks "
            f"together, {num(c.rank_seconds, 1)} rank-seconds): the left chart shows the phase of the steps, the "
            "right one the part of the step.")
    if top:
        text += f" Most of that time ({num(percent(top[1], c.rank_seconds), 0)} %) went to {top[0]}."
    pies = [charts.pie(f"Phase during {kind.what} bottlenecks", c.phases, unit="rank-seconds"),
            charts.pie(f"Part of the step during {kind.what} bottlenecks", c.parts, unit="rank-seconds")]
    rows = [[label, seconds, percent(seconds, c.rank_seconds)]
            for label, seconds in sorted(c.parts.items(), key=lambda kv: -kv[1])]
    return [Paragraph(text), Chart(row(*pies), caption=f"The training loop during {kind.what} bottlenecks"),
            Table(["Where the time went", "Rank-seconds", "% of the time"], rows,
                  caption=f"The training loop during {kind.what} bottlenecks")]
