"""1. Training job summary: how the job ended, when it ran, and how its time split into initialization (before
the first step), the training loop (first step's start to last step's end) and finalization (after the last
step) — all from the analysis's JobSummary."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.summary import JobSummary
from stallwatch.present.report.breakdowns import pie
from stallwatch.present.report.model import (
    GOOD,
    INFO,
    ISSUE,
    WARN,
    Block,
    Chart,
    NotApplicable,
    Paragraph,
    Section,
    Table,
    Verdict,
)
from stallwatch.timeutil import format_duration, format_us

SECTION_ID = "summary"
TITLE = "Training job summary"
INTRO = ("The following table gives a summary about the training job. The table includes information about when "
         "the training job started and ended, how much time initialization, training loop and finalization took.")


def _seconds(s: float) -> str:
    return format_duration(s) if s >= 60 else f"{s:.1f} s"


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def build(analysis: RunAnalysis) -> list[Section]:
    s = analysis.summary
    if s.start_us is None:
        return [Section(SECTION_ID, TITLE, [NotApplicable("The run records no start time: no node has reported yet.")])]
    blocks: list[Block] = [fate_verdict(s)]
    blocks.append(Paragraph(f"{INTRO} Your training job started on {format_us(s.start_us)} and ran for "
                            f"{_seconds(s.duration_s)}."))
    blocks += [Verdict(note, WARN) for note in s.notes]
    if s.end_us is None:
        blocks.append(Verdict("No node has recorded its end yet (the job may still be running): the end shown is "
                              "that of the data so far.", INFO))
    rows: list[list[object]] = [["Command", " ".join(s.command) or "–"], ["Exit", exit_text(s)],
                                ["Nodes", ", ".join(s.nodes) or "–"],
                                ["Start time", format_us(s.start_us)], ["End time", format_us(s.last_us)],
                                ["Job duration", _seconds(s.duration_s)]]
    parts = s.parts_s()
    if parts is None or s.loop is None:
        blocks.append(Table(["", "Job statistics"], rows))
        failed = s.ended_before_first_step
        blocks.append(NotApplicable(
            f"No step was recorded: {failed}, so the job never reached its training loop; the table shows the "
            "job's span only." if failed else
            "No step information was profiled from your training job (no framework events), so the time spent on "
            "initialization, the training loop and finalization cannot be computed; the table shows the job's span "
            "only. Steps are recorded when a PyTorch job runs under `stallwatch run`."))
        return [Section(SECTION_ID, TITLE, blocks)]
    total = s.duration_s
    rows += [["Training loop start", format_us(s.loop.first_us)], ["Training loop end", format_us(s.loop.last_us)],
             ["Training loop duration", _seconds(parts["Training loop"])],
             ["Steps (all ranks)", ", ".join(f"{n:,} {mode}" for mode, n in s.steps.items())],
             ["Initialization time", _seconds(parts["Initialization"])],
             ["Finalization time", _seconds(parts["Finalization"])]]
    rows += [[name, f"{_pct(v, total):.1f} %"] for name, v in parts.items()]
    blocks.append(verdict(parts, total))
    blocks.append(Table(["", "Job statistics"], rows))
    blocks.append(Chart(pie(parts, title="Initialization, training loop and finalization", unit="seconds"),
                        "Where the job's time went"))
    if len(s.nodes) > 1:
        blocks.append(_per_node(analysis))
    return [Section(SECTION_ID, TITLE, blocks)]


def exit_text(s: JobSummary) -> str:
    fate = s.fate
    if fate.state == "running":
        return "still running"
    if fate.code is None:
        return "not recorded"
    text = f"exit code {fate.code}"
    if fate.signal:
        text += f", {fate.signal}"
    if fate.interrupted:
        text += ", interrupted"
    return text


def fate_verdict(s: JobSummary) -> Verdict:
    """How the job ended, first: a crash, a kill or an interruption is never dressed up as a good run."""
    fate = s.fate
    steps = f"{s.total_steps:,} steps recorded" if s.total_steps else "no training step recorded"
    sentence = f"The job {fate.phrase()} after {_seconds(s.duration_s)}; {steps}."
    if fate.ended_badly:
        return Verdict(sentence + " The analyses below cover what ran until then.", ISSUE)
    if fate.state in ("running", "unknown", "stopped"):
        return Verdict(sentence, INFO)
    return Verdict(sentence, GOOD if s.total_steps else INFO)


def verdict(parts: dict[str, float], total: float) -> Verdict:
    """The sentence on how the job's time split: initialization longer than the loop is the finding. It speaks
    of the split only (the findings at the top judge the loop itself)."""
    init, loop, fin = parts["Initialization"], parts["Training loop"], parts["Finalization"]
    if init > loop:
        return Verdict(f"Initialization took {_seconds(init)} ({_pct(init, total):.0f} % of the job), longer than the "
                       f"training loop ({_seconds(loop)}). Look at what the job does before its first step: "
                       "downloading or preprocessing data, building or compiling the model, waiting for other nodes.",
                       WARN)
    share = _pct(loop, total)
    if share >= 50:
        return Verdict(f"The training loop took {share:.0f} % of the job's time ({_seconds(loop)} of "
                       f"{_seconds(total)}).", INFO)
    return Verdict(f"The training loop took only {share:.0f} % of the job's time: initialization "
                   f"{_pct(init, total):.0f} %, finalization {_pct(fin, total):.0f} % (checkpointing, uploads and "
                   "evaluation after the last step count as finalization).", INFO)


def _per_node(analysis: RunAnalysis) -> Table:
    """Multi-node runs: each node's span and its training loop (a node that starts late holds the others)."""
    spans = analysis.loop_spans
    rows = []
    for node in analysis.nodes:
        rec = analysis.node_record(node)
        start, end = rec.start_us, rec.last_us
        span = spans.get(node)
        first, last = (span.first_us, span.last_us) if span else (None, None)
        init = _seconds(max(first - start, 0) / 1e6) if first is not None and isinstance(start, int) else "–"
        rows.append([node, format_us(start), format_us(end),
                     _seconds((end - start) / 1e6) if isinstance(start, int) and isinstance(end, int) else "–",
                     format_us(first), format_us(last), init])
    return Table(["node", "start", "end", "duration", "first step", "last step", "initialization"], rows,
                 "Per node")
