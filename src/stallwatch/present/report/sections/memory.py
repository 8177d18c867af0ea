"""5. Memory per step: each rank's host memory (and, on CUDA, the allocator's) against its steps, MemoryGrowth's
verdict with the rate and the limit it heads for, the lines the automatic capture saw keeping memory, and how
the job died of memory when it did."""

from __future__ import annotations

from typing import Any

import numpy as np

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.memory import CUDA_ALLOC, CUDA_PEAK, CUDA_RESERVED, LABELS, RSS, MemorySeries, memory_timeline
from stallwatch.analyze.rules.memory_growth import MemoryGrowthDetails
from stallwatch.present.charts import Line, PanelSpec, TimeSpec
from stallwatch.present.report.model import GOOD, ISSUE, WARN, Chart, Paragraph, Section, Table, Verdict
from stallwatch.present.report.sections._loop import num, rule_view
from stallwatch.records import STEP

RULE = "MemoryGrowth"
TITLE = "Memory per step"
SITES = 5


def _short(where: str) -> str:
    """A frame as its last two path parts and line: torch/optim/sgd.py:96 reads better than its whole path."""
    path, _, line = where.rpartition(":")
    parts = path.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{line}" if path else where


def build(analysis: RunAnalysis) -> list[Section]:
    sec = Section("memory", TITLE, level=3)
    view, missing = rule_view(analysis, RULE, "the memory analysis")
    if missing is not None:
        sec.blocks.append(missing)
        return [sec]
    assert view is not None
    d = MemoryGrowthDetails.from_json(view.details)
    p = view.parameters
    sec.blocks.append(Paragraph(
        "Each step records the process's resident memory (RSS) and, on CUDA, the caching allocator's allocated and "
        f"reserved bytes. The MemoryGrowth rule skipped each rank's first {p.get('patience')} steps (warm-up), took "
        f"the median of every {p.get('window')} steps and fitted a robust slope (Theil–Sen) to them: it fires when "
        f"memory grows at least {num(p.get('min_rate_mb'), 0)} MB per 1,000 steps, still grows in the run's second "
        f"half, and grew at least {num(p.get('min_growth_mb'), 0)} MB in all. A cache that fills and stays does not "
        "fire it."))
    table = analysis.run.framework(kinds={STEP}, fields=("kind", "mode", "step", "start_us", "end_us", "args"))
    series = memory_timeline(table)
    for metrics, label in (((RSS,), "Host memory (RSS)"), ((CUDA_ALLOC, CUDA_RESERVED, CUDA_PEAK), "GPU memory")):
        shown = [s for s in series if s.metric in metrics]
        if shown:
            limits = sorted({(g.limit_mb, g.limit_source) for g in d.series.values()
                             if g.metric in metrics and g.limit_mb is not None})
            sec.blocks.append(Chart(_chart(f"{label} per step", shown, limits[:1]),
                                    caption=f"{label} at the end of each step, per rank (MB; medians of equal step "
                                            "ranges on long runs)"))
    if d.series:
        sec.blocks.append(Table(
            ["Rank", "Memory", "From step", "Start MB", "Last MB", "MB per 1,000 steps", "Late half", "Limit MB",
             "Limit", "Steps to limit", "Fires"],
            [[f"{g.node}/{g.rank}", LABELS.get(g.metric, g.metric), g.since_step, g.start_mb, g.last_mb,
              g.rate_mb_per_1000, g.late_rate_mb_per_1000, g.limit_mb, g.limit_source or "",
              g.steps_to_limit if g.steps_to_limit is not None else "", "yes" if g.triggered else ""]
             for g in d.series.values()], caption="Memory against steps, per rank"))
    for c in d.captures:
        if c.sites:
            sec.blocks.append(Table(
                ["Where", "What", "Grown KB", "Count", "Called from (innermost first)"],
                [[_short(s.where), "tensors kept" if s.kind == "tensors" else "Python heap", s.size_kb, s.count,
                  " ← ".join(_short(f) for f in reversed(s.traceback[-3:]))] for s in c.sites[:SITES]],
                caption=f"Where memory grows on rank {c.node}/{c.rank}: steps {c.first_step}–{c.last_step} "
                        f"(automatic capture, {num(c.cost_ms, 0)} ms of the job's time)"))
        if c.cuda_snapshot:
            sec.blocks.append(Paragraph(f"The CUDA allocator's history of rank {c.node}/{c.rank} is kept in the run "
                                        f"({c.cuda_snapshot}): drop it on pytorch.org/memory_viz to see every "
                                        "allocation with its stack."))
    if d.death is not None:
        tail = f"; {d.death.growth}" if d.death.growth else ""
        sec.blocks.append(Verdict(f"The job {d.death.head}{tail}.", ISSUE))
    elif d.title:
        sec.blocks.append(Verdict(d.title + ".", ISSUE if any(g.within_horizon for g in d.series.values()) else WARN))
    else:
        sec.blocks.append(Verdict("Memory did not grow with steps on any rank.", GOOD))
    return [sec]


def _chart(title: str, series: list[MemorySeries], limits: list[tuple[Any, Any]]) -> TimeSpec:
    """Each rank's memory against its step numbers, the limit it heads for as a dashed line."""
    lines = [Line(f"{s.node}/{s.rank} {LABELS.get(s.metric, s.metric)}", np.asarray(s.steps, dtype=np.float64),
                  np.asarray(s.mb, dtype=np.float64)) for s in series]
    panel = PanelSpec(title, "MB", lines, height=300)
    for mb, source in limits:
        panel.hlines.append({"y": float(mb), "label": f"the {source} limit"})
        panel.title = f"{title} (dashed: the {source} limit, {num(mb, 0)} MB)"
    return TimeSpec(panels=[panel], x_type="linear", x_label="step")
