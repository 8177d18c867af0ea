"""What to fix first, at the top of the report: the verdict (the job's fate first when it did not end well),
then the findings ranked by the training time at stake, each with where it was seen and the change to try;
a healthy run says so with its evidence. The same findings as the terminal summary and findings.json."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.captures import LOST, Capture
from stallwatch.analyze.findings import Finding, Findings, share_text
from stallwatch.analyze.python_profiles import WindowFunctions
from stallwatch.present.console import where_text
from stallwatch.present.report.model import GOOD, INFO, ISSUE, WARN, Block, NotApplicable, Paragraph, Section, Table, Verdict
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
    blocks += python_blocks(analysis.python_functions, captures)
    return [Section(SECTION_ID, TITLE, blocks)]


PYTHON_TEXT = ("What the Python profiler saw in each Python-profiling window: the functions that took the most time "
               "themselves (own time), with the time of what they called (cumulative) and their calls (for "
               "pyinstrument: the frames it sampled). The full profile is stored in the window's directory, to open "
               "with snakeviz or pyinstrument.")
PROFILERS = {"cprofile": "cProfile", "pyinstrument": "pyinstrument"}  # as the profilers spell themselves
MAX_WINDOWS = 6  # windows whose functions are listed: a run with many windows lists the first ones


def python_blocks(windows: list[WindowFunctions], captures: list[Capture]) -> list[Block]:
    """Each Python-profiling window's top functions (from the summary stored with it; never the raw profile)."""
    if not windows:
        return []
    asked = {path: c.rule for c in captures for path in c.windows}
    blocks: list[Block] = [Paragraph(PYTHON_TEXT)]
    for w in windows[:MAX_WINDOWS]:
        steps = (f"steps {w.first_step}–{w.last_step}" if w.first_step is not None and w.last_step is not None
                 and w.last_step != w.first_step else f"step {w.first_step}" if w.first_step is not None
                 else f"from {format_us(w.start_us)}")
        by = f", the capture {asked[w.path]} asked for" if w.path in asked else ""
        caption = f"{PROFILERS.get(w.profiler, w.profiler)} on {w.node} rank {w.rank}, {steps}{by}: `{w.path}`"
        if not w.top:
            why = f" ({w.summary_error})" if w.summary_error else ""
            blocks.append(NotApplicable(f"{caption}: no function summary was stored with it{why}."))
            continue
        shown = f"top {len(w.top)} of {w.total:,} functions" if w.total > len(w.top) else f"{w.total} functions"
        blocks.append(Table(["function", "where", "calls", "own (ms)", "cumulative (ms)"],
                            [[f.function, _where(f.file, f.line), f.calls, f.self_us / 1e3, f.total_us / 1e3]
                             for f in w.top], f"{caption} — {shown}"))
    if len(windows) > MAX_WINDOWS:
        blocks.append(Paragraph(f"{len(windows) - MAX_WINDOWS} more Python-profiling window(s) are stored in the run "
                                "(`stallwatch ls` lists them; their functions are in `Run.functions()`)."))
    return blocks


def _where(file: str, line: int) -> str:
    """A function's file as its last two path parts and line: enough to find it, short enough for the table."""
    if file in ("~", ""):  # cProfile's file of a built-in (C) function
        return "built-in"
    parts = file.replace("\\", "/").rstrip("/").split("/")
    short = "/".join(parts[-2:]) if len(parts) > 2 else file
    return f"{short}:{line}" if line else short


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
