"""What the run cost, when a price per node-hour is known (`--price-per-hour` or the config's
`price_per_hour`): the total, per part of the job, the share spent waiting, and right-sizing advice with its
evidence and estimated saving."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.price import money
from stallwatch.present.report.model import INFO, WARN, Block, Paragraph, Section, Table, Verdict

SECTION_ID = "cost"
TITLE = "Cost and right-sizing"


def build(analysis: RunAnalysis) -> list[Section]:
    cost = analysis.cost
    if cost is None:
        return []
    blocks: list[Block] = [Verdict(f"This run cost {cost.line()}.", INFO)]
    if cost.parts:
        blocks.append(Table(["part of the job", "cost"], [[k, money(v)] for k, v in cost.parts.items()],
                            "Cost per part of the job"))
    if cost.waiting:
        share = 100.0 * cost.waiting_total / cost.total if cost.total > 0 else 0.0
        blocks.append(Paragraph(f"About {money(cost.waiting_total)} ({share:.0f} % of the cost) paid for waiting: "
                                "idle GPUs are priced by their unused capacity, data and straggler waits by the "
                                "training loop's time spent in them (estimates; they can overlap)."))
        blocks.append(Table(["waiting on", "cost (est.)"], [[k, money(v)] for k, v in cost.waiting.items()],
                            "What waiting cost"))
    for advice in cost.advice:
        saving = (f" Estimated saving: {money(advice.saving)} per run like this one ({advice.saving_pct:.0f} %)."
                  if advice.saving is not None and advice.saving_pct is not None else "")
        blocks.append(Verdict(f"{advice.title}. Evidence: {advice.evidence}.{saving}", WARN))
    return [Section(SECTION_ID, TITLE, blocks)]
