"""4. Rules summary: every rule with its description, recommendation, times fired, datapoints and
parameters, most often fired first (the console summary's order), with the seeds' headline sentence."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import ERROR, NOT_APPLICABLE, OK, RuleResult, by_times_fired, not_applicable_groups
from stallwatch.present.report.model import GOOD, ISSUE, WARN, Block, NotApplicable, Paragraph, Section, Table, Verdict

SECTION_ID = "rules"
TITLE = "Rules summary"
INTRO = ("The following table shows a profiling summary of the stallwatch rules. The table is sorted by the rules "
         "that triggered the most frequently.")


def headline(ordered: list[RuleResult]) -> str:
    top = next((r for r in ordered if r.status == OK), None)
    if top is None or top.triggered == 0:
        return INTRO
    return (f"{INTRO} During your training job, the {top.name} rule was the most frequently triggered. It processed "
            f"{top.datapoints:,} datapoints and was triggered {_times(top.triggered)}.")


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n:,} times"


def build(analysis: RunAnalysis) -> list[Section]:
    ordered = by_times_fired(analysis.rule_results)
    if not ordered:
        return [Section(SECTION_ID, TITLE, [NotApplicable("No rule results: the rules could not be evaluated.")])]
    blocks: list[Block] = [Paragraph(headline(ordered))]
    fired = [r for r in ordered if r.status == OK and r.triggered > 0]
    for r in fired:
        blocks.append(Verdict(f"{r.name} was triggered {_times(r.triggered)}: {r.recommendation}", WARN))
    if not fired and any(r.status == OK for r in ordered):
        blocks.append(Verdict("No rule was triggered: nothing in this run crossed a rule's threshold.", GOOD))
    for r in ordered:
        if r.status == ERROR:
            blocks.append(Verdict(f"{r.name} could not be evaluated: {r.message}", ISSUE))
    rows = [[r.name, r.description, r.recommendation, r.triggered, r.datapoints,
             "\n".join(f"{k}: {v}" for k, v in r.parameters.items())]  # one parameter a line
            for r in ordered if r.status == OK]
    blocks.append(Table(["rule", "description", "recommendation", "fired", "data points", "parameters"], rows))
    for reason, names in not_applicable_groups([r for r in ordered if r.status == NOT_APPLICABLE]).items():
        blocks.append(NotApplicable(f"Not applicable: {', '.join(names)} — {reason}"))
    return [Section(SECTION_ID, TITLE, blocks)]
