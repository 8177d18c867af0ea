"""Timeline: the job's system metrics over its whole duration, one line per node, with the training phases
shaded and the moments the rules flagged (bottleneck ranges, flagged windows, outlier steps) overlaid. The
lines, phases and flags come from the analysis (`analyze/timeline.py`); this draws them."""

from __future__ import annotations

from typing import Any

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.series import Marker, Span
from stallwatch.analyze.timeline import MAX_MARKERS, TIMELINE_METRICS
from stallwatch.present import charts
from stallwatch.present.report.model import Chart, NotApplicable, Paragraph, Section, Table
from stallwatch.timeutil import format_us

INTRO = ("The system metrics of every node over the whole job, one line per node (CPU utilization of all cores "
         "and the job's own, GPU utilization, memory, I/O wait, network), with the training phases and the top "
         "findings' windows shaded, and every range and moment the rules flagged in the track on top. "
         "Scroll to zoom into a stretch of time, drag to pan; click a legend entry to hide it. Each line keeps the "
         "minimum and the maximum of every time bucket, so short spikes and drops stay visible however long the "
         "job ran.")
NO_TIMES = ("The flagged track shows the CPU and I/O bottleneck ranges (the first 100 of each), the windows "
            "LowGPUUtilization, GPUMemoryIncrease and BatchSize flagged (the first 100 per node of each) and the "
            f"slowest outlier steps (at most {MAX_MARKERS}, one mark per step number however many ranks it was slow "
            "on). Dataloader, LoadBalancing, OverallSystemUsage and OverallFrameworkMetrics describe the whole run; "
            "MaxInitializationTime is the initialization phase.")


FINDINGS_TEXT = ("\"Finding 1\", \"Finding 2\"…: where the findings of \"What to fix first\" happened, in their "
                 "order there — their time windows shaded (the first 20), or, for a finding without windows, its steps "
                 "marked (the first 20).")


def build(analysis: RunAnalysis) -> list[Section]:
    section = Section("timeline", "Timeline", [Paragraph(INTRO)])
    drawn = analysis.drawn_nodes()
    shown = analysis.timeline_panels(drawn)
    if not shown:
        section.blocks.append(NotApplicable("No node recorded system metrics, so there is no timeline to show."))
        return [section]
    spans = analysis.phase_spans
    found_spans, found_markers = analysis.finding_marks  # where the top findings happened, first in the legend
    flags, markers = found_spans + analysis.flagged_spans, found_markers + analysis.flagged_markers
    missing = [m.title for m in TIMELINE_METRICS if m.title not in {p.title for p in shown}]
    text = "" if not missing else f" Not recorded on any node: {', '.join(missing)}."
    if not spans:
        text += " The job recorded no training steps, so no training phases are shaded."
    if len(drawn) < len(analysis.nodes):
        text += (f" Lines of {len(drawn)} of the {len(analysis.nodes)} nodes are drawn: those the findings name "
                 "first, then those that stand out in the node comparison, then by name (the shading and the "
                 "flags are every node's).")
    if text:
        section.blocks.append(Paragraph(text.strip()))
    model = charts.timeline(shown, spans=spans, flags=flags, markers=markers,
                            shade=[s.label for s in found_spans])  # the top findings' windows, shaded too
    section.blocks.append(Chart(model, "System metrics per node over time"))
    rows = _flag_rows(spans + flags, markers, analysis.flag_totals)
    if rows:
        section.blocks.append(Table(["Overlay", "Shown", "Reported", "First", "Last"], rows,
                                    "What is shaded and flagged"))
    if found_spans or found_markers:
        section.blocks.append(Paragraph(FINDINGS_TEXT))
    section.blocks.append(Paragraph(NO_TIMES))
    return [section]


def _flag_rows(spans: list[Span], markers: list[Marker], totals: dict[str, int]) -> list[list[Any]]:
    rows = []
    for label in dict.fromkeys([s.label for s in spans] + [m.label for m in markers]):
        times = [s.start_us for s in spans if s.label == label] + [m.at_us for m in markers if m.label == label]
        rows.append([label, len(times), totals.get(label, len(times)), format_us(min(times)), format_us(max(times))])
    return rows
