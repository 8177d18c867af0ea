"""1. Training job summary: when the job ran, and how its time split into initialization (before the first
step), the training loop (first step's start to last step's end) and finalization (after the last step)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.present.report.breakdowns import pie
from stallwatch.present.report.context import ReportContext
from stallwatch.present.report.model import (GOOD, INFO, WARN, Block, Chart, NotApplicable, Paragraph, Section, Table,
                                             Verdict)
from stallwatch.records import STEP
from stallwatch.timeutil import format_duration, format_us

SECTION_ID = "summary"
TITLE = "Training job summary"
INTRO = ("The following table gives a summary about the training job. The table includes information about when "
         "the training job started and ended, how much time initialization, training loop and finalization took.")


@dataclass(frozen=True)
class Span:
    """The job's span and its training loop's (None without steps), µs since the epoch."""
    start_us: int
    end_us: int
    first_step_us: int | None = None
    last_step_us: int | None = None

    @property
    def duration_s(self) -> float:
        return max(self.end_us - self.start_us, 0) / 1e6

    @property
    def has_loop(self) -> bool:
        return self.first_step_us is not None and self.last_step_us is not None

    def parts_s(self) -> dict[str, float]:
        """Initialization, training loop, finalization in seconds (clamped at 0: a node's clock may differ)."""
        assert self.first_step_us is not None and self.last_step_us is not None
        return {"Initialization": max(self.first_step_us - self.start_us, 0) / 1e6,
                "Training loop": max(self.last_step_us - self.first_step_us, 0) / 1e6,
                "Finalization": max(self.end_us - self.last_step_us, 0) / 1e6}


def step_span(events: pa.Table) -> tuple[int, int, int] | None:
    """First step start, last step end and the number of steps, over every node and rank (None: no step)."""
    spans = step_spans(events)
    if not spans:
        return None
    return (min(v[0] for v in spans.values()), max(v[1] for v in spans.values()), sum(v[2] for v in spans.values()))


def step_spans(events: pa.Table) -> dict[str, tuple[int, int, int]]:
    """Per node: first step start, last step end and the number of steps (one grouped pass, no copy)."""
    if events.num_rows == 0:
        return {}
    kinds = {v for c in events["kind"].chunks
             for v in (c.dictionary if pa.types.is_dictionary(c.type) else pc.unique(c)).to_pylist()}
    if kinds != {STEP}:  # (ctx.steps holds steps only: no filter, no copy)
        events = events.filter(pc.equal(events["kind"], STEP))
    if events.num_rows == 0:
        return {}
    grouped = events.select(["node", "start_us", "end_us"]).unify_dictionaries().group_by("node").aggregate(
        [("start_us", "min"), ("end_us", "max"), ("start_us", "count")])
    return {str(n): (int(a), int(b), int(c)) for n, a, b, c in zip(
        grouped["node"].to_pylist(), grouped["start_us_min"].to_pylist(), grouped["end_us_max"].to_pylist(),
        grouped["start_us_count"].to_pylist())}


def _seconds(s: float) -> str:
    return format_duration(s) if s >= 60 else f"{s:.1f} s"


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def build(ctx: ReportContext) -> list[Section]:
    info = ctx.info
    start, end = info.get("start_us"), info.get("end_us")
    if start is None:
        return [Section(SECTION_ID, TITLE, [NotApplicable("The run records no start time: no node has reported yet.")])]
    steps = step_span(ctx.steps)
    end_us = int(end) if end is not None else (steps[1] if steps else int(start))
    span = Span(int(start), max(end_us, int(start)), *(steps[:2] if steps else (None, None)))
    blocks: list[Block] = [Paragraph(f"{INTRO} Your training job started on {format_us(span.start_us)} and ran for "
                                     f"{_seconds(span.duration_s)}.")]
    if end is None:
        blocks.append(Verdict("No node has recorded its end yet (the job may still be running): the end shown is "
                              "that of the data so far.", INFO))
    rows: list[list[object]] = [["Command", " ".join(str(c) for c in info.get("command") or []) or "–"],
                                ["Nodes", ", ".join(ctx.nodes) or "–"],
                                ["Start time", format_us(span.start_us)], ["End time", format_us(span.end_us)],
                                ["Job duration", _seconds(span.duration_s)]]
    if not span.has_loop:
        blocks.append(Table(["", "Job statistics"], rows))
        blocks.append(NotApplicable(
            "No step information was profiled from your training job (no framework events), so the time spent on "
            "initialization, the training loop and finalization cannot be computed; the table shows the job's span "
            "only. Steps are recorded when a PyTorch job runs under `stallwatch run`."))
        return [Section(SECTION_ID, TITLE, blocks)]
    parts = span.parts_s()
    total = span.duration_s
    assert steps is not None
    rows += [["Training loop start", format_us(span.first_step_us)],
             ["Training loop end", format_us(span.last_step_us)],
             ["Training loop duration", _seconds(parts["Training loop"])], ["Steps (all ranks)", f"{steps[2]:,}"],
             ["Initialization time", _seconds(parts["Initialization"])],
             ["Finalization time", _seconds(parts["Finalization"])]]
    rows += [[name, f"{_pct(s, total):.1f} %"] for name, s in parts.items()]
    blocks.append(verdict(parts, total))
    blocks.append(Table(["", "Job statistics"], rows))
    blocks.append(Chart(pie(parts, title="Initialization, training loop and finalization", unit="seconds"),
                        "Where the job's time went"))
    if len(ctx.nodes) > 1:
        blocks.append(_per_node(ctx))
    return [Section(SECTION_ID, TITLE, blocks)]


def verdict(parts: dict[str, float], total: float) -> Verdict:
    """The sentence on how the job's time split: initialization longer than the loop is the finding."""
    init, loop, fin = parts["Initialization"], parts["Training loop"], parts["Finalization"]
    if init > loop:
        return Verdict(f"Initialization took {_seconds(init)} ({_pct(init, total):.0f} % of the job), longer than the "
                       f"training loop ({_seconds(loop)}). Look at what the job does before its first step: "
                       "downloading or preprocessing data, building or compiling the model, waiting for other nodes.",
                       WARN)
    share = _pct(loop, total)
    if share >= 50:
        return Verdict(f"The training loop took {share:.0f} % of the job's time ({_seconds(loop)} of "
                       f"{_seconds(total)}).", GOOD)
    return Verdict(f"The training loop took only {share:.0f} % of the job's time: initialization "
                   f"{_pct(init, total):.0f} %, finalization {_pct(fin, total):.0f} % (checkpointing, uploads and "
                   "evaluation after the last step count as finalization).", INFO)


def _per_node(ctx: ReportContext) -> Table:
    """Multi-node runs: each node's span and its training loop (a node that starts late holds the others)."""
    spans = step_spans(ctx.steps)
    rows = []
    for node in ctx.nodes:
        rec = ctx.node_info(node)
        start, end = rec.get("start_us"), rec.get("end_us") or rec.get("end_us_from_data")
        steps = spans.get(node)
        first, last = (steps[0], steps[1]) if steps else (None, None)
        init = _seconds(max(first - start, 0) / 1e6) if first is not None and start is not None else "–"
        rows.append([node, format_us(start), format_us(end),
                     _seconds((end - start) / 1e6) if start is not None and end is not None else "–",
                     format_us(first), format_us(last), init])
    return Table(["node", "start", "end", "duration", "first step", "last step", "initialization"], rows,
                 "Per node")
