"""5. Hangs: the Hang rule's stopped ranks, the phase each is in, the rank behind, each stopped rank's main-thread
stack (innermost last) and where every thread's stacks are kept in the run. It renders the rule's Details only."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.rules.hang import HangDetails
from stallwatch.present.report.model import GOOD, ISSUE, WARN, Paragraph, Section, Table, Verdict
from stallwatch.present.report.sections._loop import duration, num, rule_view, when

RULE = "Hang"
TITLE = "Hangs"


def build(analysis: RunAnalysis) -> list[Section]:
    sec = Section("hang", TITLE, level=3)
    view, missing = rule_view(analysis, RULE, "the hang analysis")
    if missing is not None:
        sec.blocks.append(missing)
        return [sec]
    assert view is not None
    try:
        d = HangDetails.from_json(view.details)
    except (KeyError, TypeError, ValueError):
        sec.blocks.append(Paragraph("The Hang rule's details have an unexpected shape; see rules/Hang.json."))
        return [sec]
    sec.blocks.append(Paragraph(
        f"The Hang rule watches every rank's progress: a rank that goes more than {num(d.factor)} times its median "
        f"step (of its recent steps), and at least {num(d.floor_s)} s, without finishing a step has stopped. Time is "
        "read from the sampler's snapshots, which go on while a rank is stuck. When a rank stops during the run, "
        "every process of the job is asked for the Python stacks of all its threads; they are kept in the run "
        "(stacks/<node>/<rank>/), and the phase of each stopped rank and the rank behind are read from them."))
    if not view.triggered:
        sec.blocks.append(Verdict(f"Every rank kept making progress ({len(d.ranks)} ranks).", GOOD))
        return [sec]
    text = (d.title or "The job stopped making progress") + "."
    if d.behind_reason:
        text += f" {d.behind_reason[0].upper()}{d.behind_reason[1:]}."
    sec.blocks.append(Verdict(f"{text} {view.recommendation}", ISSUE if d.stopped else WARN))
    rows = [[key, duration(r.idle_s) if r.stopped else "-", duration(r.limit_s), r.last_step, r.steps,
             r.phase_text or ("-" if not r.stopped else "unknown: no stacks"), ", ".join(r.stacks) or "-"]
            for key, r in d.ranks.items() if r.stopped or key in d.behind]
    if rows:
        sec.blocks.append(Table(["Rank", "Stopped for", "Limit", "Last step", "Steps", "Doing", "Stacks in the run"],
                                rows, "The stopped ranks (at the end of the run, or when this report was made)"))
    for key in d.stopped:
        r = d.ranks[key]
        if not r.main_stack:
            continue
        frames = [line.partition("  |  ") for line in r.main_stack]
        sec.blocks.append(Table(["Frame (innermost last)", "Code"], [[f, code] for f, _, code in frames],
                                f"Rank {key}: its main thread" + (f" (of {r.threads} threads)" if r.threads > 1
                                                                  else "")))
    ended = [s for s in d.stalls if s.until_us is not None]
    if ended:
        sec.blocks.append(Table(["Rank", "From", "To", "Stood still", "Limit"],
                                [[f"{s.node}/{s.rank}", when(s.since_us), when(s.until_us), duration(s.seconds),
                                  duration(s.limit_s)] for s in ended],
                                "Stalls that ended: the rank went on afterwards"))
    return [sec]
