"""What to fix first, at the top of the report: the verdict (the job's fate first when it did not end well),
then the findings ranked by the training time at stake, each with where it was seen and the change to try;
a healthy run says so with its evidence. The same findings as the terminal summary and findings.json."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.captures import LOST
from stallwatch.analyze.findings import Finding, Findings, share_text
from stallwatch.present.console import where_text
from stallwatch.present.report.model import GOOD, INFO, ISSUE, WARN, Block, Paragraph, Section, Table, Verdict
from stallwatch.timeutil import format_duration, format_us

SECTION_ID = "findings"
TITLE = "What to fix first"


def build(analysis: RunAnalysis) -> list[Section]:
    f = analysis.findings
    blocks: list[Block] = [Verdict(f.verdict, level(f))]
    blocks += [Verdict(note, WARN) for note in f.notes]
    if f.findings:
        blocks.append(Paragraph(
            "Each finding below is one problem the rules found, most training time at stake first. The time at stake "
            "is an estimate of what fixing it could save (for example the time the training loop waited for data, "
            "or the time GPUs sat idle during bottlenecks); severity is that time's share of the training loop (of the whole job for time outside the loop, such as start-up)."))
        blocks.append(Table(["#", "Severity", "Finding", "Time at stake", "Share", "Where", "What to try"],
                            [_row(i, x) for i, x in enumerate(f.findings, 1)]))
    captures = analysis.captures
    if captures:
        lost = [c for c in captures if c.status == LOST]
        blocks.append(Paragraph("When a rule fired during the run, stallwatch captured a few seconds of detail on its "
                                "own (escalation): the operators of those steps are in the framework section and "
                                "the timeline export; each capture's cost is shown with the profiling windows."))
        if lost:
            blocks.append(Verdict(f"{len(lost)} automatic capture{'s were' if len(lost) > 1 else ' was'} asked for "
                                  "and never stored: the job ended (killed or crashed) before "
                                  f"{'they were' if len(lost) > 1 else 'it was'} written", WARN))
        blocks.append(Table(["Rule that fired", "Time asked for", "Layers", "Why", "Stored"],
                            [[c.rule, f"{format_us(c.start_us)} → {format_us(c.end_us)}", " + ".join(c.layers),
                              c.reason, c.why] for c in captures],
                            "Automatic captures"))
    return [Section(SECTION_ID, TITLE, blocks)]


def level(f: Findings) -> str:
    if f.fate.ended_badly:
        return ISSUE
    if f.findings:
        return ISSUE if f.findings[0].severity == "high" else WARN
    return GOOD if f.healthy else INFO


def _row(i: int, x: Finding) -> list[object]:
    return [i, x.severity, x.title, format_duration(x.time_at_stake_s) if x.time_at_stake_s is not None else "–",
            share_text(x.share_of_loop, x.share_of) or "–", where_text(x) or "the whole run",
            x.recommendation]
