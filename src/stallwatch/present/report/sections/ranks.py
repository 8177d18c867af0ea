"""Ranks step by step: a rank × step heatmap of step time and of data wait (the share of each step spent
waiting for the next batch). Where ranks differ, the straggler finding names the rank; here the reader sees
when it happened and what the others did meanwhile."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.rules.straggler import StragglerDetails
from stallwatch.present import charts
from stallwatch.present.report.model import Block, Chart, NotApplicable, Paragraph, Section

SECTION_ID = "ranks"
TITLE = "Ranks step by step"
INTRO = ("Every rank is a row and the x-axis is the step number; the colour is the mean duration of the steps in "
         "each column (bright: slow, dark: fast) and, below, the share of those steps spent waiting for data. In "
         "data-parallel training fast ranks wait for slow ones inside the gradient exchange, so all rows of the "
         "step-time map look alike when one rank lags; the data-wait map and the straggler finding show which.")


def build(analysis: RunAnalysis) -> list[Section]:
    m = analysis.rank_steps()
    if m is None:
        return [Section(SECTION_ID, TITLE, [NotApplicable("No training steps were recorded, so there is no rank × "
                                                          "step view.")])]
    straggler = analysis.rule("Straggler")
    slow = [s.key for s in StragglerDetails.from_json(straggler.details).stragglers] \
        if straggler is not None and straggler.fired else []
    blocks: list[Block] = [Paragraph(INTRO)]
    if m.ranks_total > len(m.ranks):
        blocks.append(Paragraph(f"The first {len(m.ranks)} of {m.ranks_total} ranks are drawn."))
    if slow:
        blocks.append(Paragraph(f"Straggler{'s' if len(slow) > 1 else ''}: {', '.join(slow)} (marked ▶)."))
    per = f", {m.steps_per_column} steps per column" if m.steps_per_column > 1 else ""
    blocks.append(Chart(charts.step_heatmap(m.ranks, m.first_step, m.steps_per_column, m.step_ms,
                                            title=f"{m.mode} step time per rank{per}", unit="ms", highlight=slow),
                        "Step time per rank and step"))
    if m.wait_pct is not None:
        blocks.append(Chart(charts.step_heatmap(m.ranks, m.first_step, m.steps_per_column, m.wait_pct,
                                                title=f"Share of each {m.mode} step waiting for data{per}",
                                                unit="%", high=100.0, highlight=slow),
                            "Data wait per rank and step"))
    else:
        blocks.append(Paragraph("No wait for data was recorded in the steps (the loop does not iterate a "
                                "DataLoader the hooks see)."))
    return [Section(SECTION_ID, TITLE, blocks)]
