"""3. Framework metrics summary: where the training loop's time went (TRAIN / EVAL / between steps, forward vs
backward, waiting for data, optimizer, collectives), then the CPU and GPU operator tables of the detailed-
profiling windows — all from the OverallFrameworkMetrics rule's details."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


from stallwatch import catalogue
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.collectives import DDP_EVENT
from stallwatch.analyze.rules.communication import CALLS, MEASURED, SAMPLED, SYNC_EVENT, CommunicationDetails
from stallwatch.analyze.framework_frame import mode_order
from stallwatch.analyze.rules.framework_metrics import OTHER, Operator, OverallFrameworkMetricsDetails
from stallwatch.present.report.breakdowns import pie
from stallwatch.present.charts import row
from stallwatch.present.report.model import INFO, WARN, Block, Chart, NotApplicable, Paragraph, Section, Table, Verdict
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, OPTIMIZER

SECTION_ID = "framework"
TITLE = "Framework metrics summary"
RULE = "OverallFrameworkMetrics"
COMMUNICATION_RULE = "CommunicationBound"
PHASE_TEXT = ("The training loop's time, from its first step's start to its last step's end, went to TRAIN steps, EVAL "
              "steps, and others: the time between steps (after one step has finished and before the next step has "
              "started). Ideally, most of it is spent in TRAIN and EVAL steps. Steps that are neither are recorded as "
              "GLOBAL.")
GPU_HOST_TIME = ("On a GPU, forward, backward and the optimizer step are timed on the host: each call returns once its "
                 "kernels are queued, so the GPU's work shows where the loop waits for it (after the step, at a "
                 "`loss.item()`, or in the call that found the queue full). The steps' durations are right either "
                 "way; the GPU's own time per operator is in the detailed-profiling sections below, when a window "
                 "was captured.")
OTHERS_WARN = 25.0  # % of the loop between steps the seeds called significant
UNEVEN = 70.0  # % forward (or backward) the seeds called a significant difference
PART_LABELS = {k: catalogue.label(k) for k in (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE, OTHER)}
GPU_OTHER = "the loop's own code or a wait for the GPU"  # the catalogue's "other", on a GPU
PIE_TOP = 9  # operators drawn as their own wedge; the rest are one
HOW_TO_PROFILE = ("To get one, profile a few steps with torch.profiler: `stallwatch run --detailed-profiling 5:1 -- "
                  "python train.py` profiles step 5 (while the job runs: `stallwatch config RUN --detailed-profiling "
                  "5:1`).")


def build(analysis: RunAnalysis) -> list[Section]:
    result = analysis.rule(RULE)
    failed = analysis.summary.ended_before_first_step
    if failed and (result is None or not result.applies):
        main = Section(SECTION_ID, TITLE, [NotApplicable(f"No framework metrics in this run: {failed}.")])
        return [main, *operator_sections(analysis, OverallFrameworkMetricsDetails())]
    if result is None or not result.applies:
        why = (result.message if result is not None else "") or "the rule's result is missing"
        main = Section(SECTION_ID, TITLE, [NotApplicable(
            f"No framework metrics in this run ({why}). They come from inside the training process: run the "
            "PyTorch job under `stallwatch run -- python train.py`, and its steps, phases and data loading are "
            "recorded with no code change.")])
        return [main, *operator_sections(analysis, OverallFrameworkMetricsDetails())]
    details = OverallFrameworkMetricsDetails.from_json(result.details)
    blocks: list[Block] = []
    blocks += _phases(details, gpu=analysis.has_gpus)
    blocks += _step_parts(details, gpu=analysis.has_gpus)
    blocks += _general(details)
    blocks += _gradient_sync(analysis)
    blocks += _ranks(details)
    blocks += _ratio(details)
    return [Section(SECTION_ID, TITLE, blocks), *operator_sections(analysis, details)]


def _seconds(values: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> dict[str, float]:
    labels = labels or {}
    return {labels.get(k, k): float(v) / 1e6 for k, v in values.items()}


def _phases(details: OverallFrameworkMetricsDetails, *, gpu: bool = False) -> list[Block]:
    phase, fb = details.phase, details.forward_backward
    out: list[Block] = []
    charts = []
    text = PHASE_TEXT
    if len(phase) == 1:
        text += f" All of it was in {next(iter(phase))} steps."
    elif phase:
        between = {"others": catalogue.label("others")}
        charts.append(pie(_seconds(details.phase_us, between), unit="seconds",
                          title="The training loop's time: steps and between them"))
    if phase:
        others = float(phase.get("others", 0.0))
        if others > OTHERS_WARN:
            out.append(Verdict(f"Your training job spent quite a significant amount of time ({others:.1f} %) in "
                               "phase \"others\", between steps: check what happens there (evaluation outside the "
                               "recorded steps, checkpointing, logging).", WARN))
    if fb:
        event, perc = next(iter(fb.items()))  # largest first
        text += (f" In the training steps, {perc:.0f} % of the time of forward and backward passes was spent in the "
                 f"{event} pass (evaluation's forward passes are not counted).")
        if perc > UNEVEN:
            text += " There is quite a significant difference between the time spent on forward and backward pass."
    out.append(Paragraph(text))
    if gpu:
        out.append(Paragraph(GPU_HOST_TIME))
    if charts:
        out.append(Chart(row(*charts), "The training loop's time in TRAIN/EVAL steps and between steps"))
    return out


def _step_parts(details: OverallFrameworkMetricsDetails, *, gpu: bool = False) -> list[Block]:
    """Per mode, where its timed steps' time went: each part a share of that mode's step time (a pie per mode; a
    sentence where there is one part only)."""
    labels = {**PART_LABELS, OTHER: GPU_OTHER} if gpu else PART_LABELS
    out: list[Block] = []
    charts = []
    for mode, m in details.modes.items():
        parts = m.parts
        if not parts:
            continue
        of = f"the {m.steps:,} timed {mode} steps' {float(m.step_us) / 1e6:,.1f} s"
        if len(parts) == 1:
            out.append(Paragraph(f"All of {of} was {labels.get(next(iter(parts)), next(iter(parts)))}."))
            continue
        listed = ", ".join(f"{labels.get(k, k)} {_pct(v)}" for k, v in parts.items())
        out.append(Paragraph(f"Of {of}: {listed}."))
        charts.append(pie(_seconds(m.parts_us, labels), unit="seconds", title=f"{mode} steps' time"))
    if charts:
        out.append(Chart(row(*charts), "Where each mode's steps spent their time (shares of that mode's step time)"))
    return out


def _pct(value: float) -> str:
    return "< 1 %" if value < 0.5 else f"{value:.0f} %"


def _general(details: OverallFrameworkMetricsDetails) -> list[Block]:
    out: list[Block] = []
    # No pie of these three against each other: their shares of one another read as shares of the loop ("87 %
    # waiting for data" beside a data wait of 10.7 % of step time). Their share of each mode's steps is above.
    collectives = {name: v for name, v in (details.events.get(COLLECTIVE) or {}).items()
                   if name not in (DDP_EVENT, SYNC_EVENT)}  # DDP's own all-reduce: said per step below
    if collectives:
        total = sum(v.total_us for v in collectives.values()) / 1e6
        out.append(Paragraph(f"Collective operations called through torch.distributed (all-reduce, broadcast, "
                             f"barriers …) took {total:,.1f} s in all ranks together, over "
                             f"{sum(v.count for v in collectives.values()):,} calls."))
    elif details.events.get(COLLECTIVE):
        pass  # only DDP's gradient all-reduce: said per step below
    else:
        out.append(Paragraph("No collective operations were recorded: a single-process job has none; a distributed "
                             "job's collectives are recorded when they run through torch.distributed."))
    events = details.events
    rows = [[catalogue.label(kind), name, v.count, v.total_us / 1e6, v.total_us / 1e3 / max(v.count, 1)]
            for kind, names in events.items() for name, v in names.items()]
    rows.sort(key=lambda r: -r[3])
    if rows:
        out.append(Table(["event", "name", "count", "total time (s)", "mean (ms)"], rows,
                         "Framework events by name (all ranks)"))
    return out


def _ranks(details: OverallFrameworkMetricsDetails) -> list[Block]:
    ranks = details.ranks
    if len(ranks) < 2:
        return []
    phases = sorted({p for r in ranks.values() for p in r.phase}, key=lambda p: (p == "others", mode_order(p), p))
    rows = []
    for key, r in ranks.items():
        fb = r.forward_backward
        rows.append([key, r.steps, *(r.phase.get(p, 0.0) for p in phases), fb.get(FORWARD, 0.0), fb.get(BACKWARD, 0.0),
                     r.general_us.get(DATA_WAIT, 0) / 1e6])
    return [Table(["rank", "steps", *(f"{p} %" for p in phases), "training forward %", "training backward %",
                   "waiting for data (s)"],
                  rows, "Per rank")]


def _gradient_sync(analysis: RunAnalysis) -> list[Block]:
    """The training step's collectives, per rank — DDP's gradient all-reduce above all: the exposed part the step
    waited for, its bytes and bandwidth, DDP's own timing of the whole. The CommunicationBound rule's numbers, so
    this paragraph and the rule's finding tell one story."""
    result = analysis.rule(COMMUNICATION_RULE)
    if result is None or not result.applies:
        return []
    try:
        d = CommunicationDetails.from_json(result.details)
    except (KeyError, TypeError, ValueError):
        return []
    top = d.top
    if top is None:
        return []
    measured = top.source == MEASURED
    what = "the gradient all-reduce" if top.source != CALLS else "the loop's collectives"
    text = ("DistributedDataParallel reduces gradients with an all-reduce during backward. " if top.source != CALLS
            else "")
    text += (f"After backward's computation ended, rank {top.rank} ({top.node}) typically waited "
             f"{top.exposed_ms:,.1f} ms a step for {what} — {top.share:.0f} % of its step time, {top.comm_s:,.1f} s "
             f"over {top.steps:,} steps")
    if top.wait_s > 0.0005:
        text += (f" ({top.mean_exposed_ms:,.1f} ms on average: {top.wait_s:,.1f} s more in steps held up by a slower "
                 "rank or a busy machine)")
    text += (", measured on every timed step." if measured else
             ", estimated from DDP's own averages over the iterations it samples (the first ones, then every "
             "100th)." if top.source == SAMPLED else ".")
    if top.total_ms is not None and top.hidden_pct is not None:
        text += (f" DDP's own timing puts the whole all-reduce at {top.total_ms:,.1f} ms a step, "
                 f"{top.hidden_pct:.0f} % of it hidden behind backward.")
    if top.bytes_per_step:
        text += f" It reduced {top.bytes_per_step / 1e6:,.1f} MB a step"
        text += (f": {top.bandwidth_gbps:,.2f} Gb/s over the exposed time." if top.bandwidth_gbps else ".")
    text += (f" The {COMMUNICATION_RULE} rule {'fired' if result.fired else 'did not fire'} (threshold "
             f"{d.threshold:g} % of step time).")
    text += (" In the table: the steps reduced; the exposed time (not hidden behind backward) of a typical step "
             "(p50) and on average, its share of a typical step and its total; the time held up beyond it; MB "
             "reduced a step and the effective bandwidth; DDP's own timing of the whole all-reduce and the share "
             "of it hidden.")
    rows = [[r.key, r.steps, r.synced_steps, r.exposed_ms, r.mean_exposed_ms, r.share, r.comm_s, r.wait_s,
             None if r.bytes_per_step is None else r.bytes_per_step / 1e6, r.bandwidth_gbps, r.total_ms,
             r.hidden_pct, r.source] for r in d.ranks]
    return [Paragraph(text),
            Table(["node/rank", "train steps", "reduced", "exposed p50 (ms)", "exposed mean (ms)", "% of step",
                   "total (s)", "held up (s)", "MB/step", "Gb/s", "DDP all-reduce (ms)", "hidden %", "source"], rows,
                  "Gradient all-reduce per step (DDP)")]


def _ratio(details: OverallFrameworkMetricsDetails) -> list[Block]:
    ratio = details.ratio
    if not ratio:
        return []
    key, perc = next(iter(ratio.items()))
    if len(ratio) == 1:
        return [Paragraph(f"All of the operators' time in the detailed-profiling windows was spent on {key} "
                          "operators.")]
    return [Paragraph(f"The following pie chart shows a breakdown of the CPU/GPU operators of the detailed-profiling "
                      f"windows. It shows that {perc:.0f} % of the operators' time was spent on executing {key} "
                      "operators."),
            Chart(pie(ratio, unit="%", title="CPU and GPU operators"),
                  "The ratio between the time spent on CPU/GPU operators")]


def operator_sections(analysis: RunAnalysis, details: OverallFrameworkMetricsDetails) -> list[Section]:
    """"CPU operators" and "GPU operators": each a table and a pie, or a plain statement why there is none."""
    tables = details.operators
    out = []
    for label, where in (("CPU", "the CPUs"), ("GPU", "the GPUs")):
        sid, title = f"{label.lower()}-operators", f"{label} operators"
        ops, count = tables.of(label)
        if ops:
            out.append(Section(sid, title, _operators(label, where, ops, count or len(ops), details.operator_windows),
                               level=3))
        else:
            out.append(Section(sid, title, [NotApplicable(_no_operators(analysis, label, bool(tables)))], level=3))
    return out


def _no_operators(analysis: RunAnalysis, label: str, any_operators: bool) -> str:
    if any_operators:  # the other device has some
        return (f"The detailed-profiling windows recorded no {label} operators"
                + (": the job ran on the CPU only (no CUDA device was profiled)." if label == "GPU" else "."))
    windows = analysis.profiles("detailed")
    if windows and analysis.operators.num_rows == 0:
        return (f"{len(windows)} detailed-profiling window(s) were recorded, but none holds an operator summary "
                "(see `summary_error` in their window.json).")
    return f"No detailed-profiling window was recorded in this run, so there are no operator tables. {HOW_TO_PROFILE}"


def _operators(label: str, where: str, ops: list[Operator], count: int, windows: int) -> list[Block]:
    top = ops[0]
    blocks: list[Block] = [Paragraph(
        f"The following table shows a list of operators that ran on {where}, by self time (the time in the operator "
        f"itself, without the operators it called). The most expensive operator on {where} was \"{top.operator}\" "
        f"with {float(top.percent):.0f} %.")]
    if float(top.percent) > 50:
        blocks.append(Verdict(f"One operator, \"{top.operator}\", took most of the {label} operators' time: it is "
                              "where the model itself can be made faster.", INFO))
    values = {str(o.operator): float(o.self_us) / 1e3 for o in ops}
    blocks.append(Chart(pie(values, unit="ms", top=PIE_TOP, rest=_unlisted_ms(ops), others="other operators",
                            title=f"{label} operators by self time"), f"{label} operators by self time"))
    rows = [[o.operator, o.calls, o.self_us / 1e3, o.total_us / 1e3, o.percent] for o in ops]
    shown = f"The {len(ops)} most expensive of {count:,}" if count > len(ops) else f"All {count:,}"
    blocks.append(Table(["operator", "calls", "self time (ms)", "total time (ms)", f"% of {label} self time"], rows,
                        f"{shown} {label} operators, over {windows} detailed-profiling window(s)"))
    return blocks


def _unlisted_ms(ops: list[Operator]) -> float:
    """Self time (ms) of the operators the rule did not list, from the listed ones' shares of the device's."""
    listed_ms = sum(float(o.self_us) for o in ops) / 1e3
    listed_pct = sum(float(o.percent) for o in ops)
    if not 0 < listed_pct < 99.999:
        return 0.0
    return listed_ms * 100.0 / listed_pct - listed_ms
