"""Section 5's heading: "Analyzing the training loop" — preceded by "Analyzing initialization" when the job
took longer to reach its first step than its training loop lasted (MaxInitializationTime's numbers)."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.max_initialization_time import MaxInitializationTimeDetails
from stallwatch.present.report.model import INFO, WARN, Paragraph, Section, Table, Verdict
from stallwatch.present.report.sections._loop import HOW_TO_RECORD, duration, num, percent, rule_view, when

RULE = "MaxInitializationTime"


def build(analysis: RunAnalysis) -> list[Section]:
    view, _ = rule_view(analysis, RULE, "the initialization analysis")
    details = MaxInitializationTimeDetails.from_json(view.details if view is not None else {})
    init_s, loop_s = details.initialization_s, details.training_loop_s
    job_s = details.job_s
    loop = Section("training-loop", "Analyzing the training loop", level=2)
    if init_s is None or loop_s is None:
        loop.blocks.append(Paragraph(_no_steps(view, analysis.summary.ended_before_first_step)))
        return [loop]
    sections = []
    if init_s > loop_s:
        sections.append(_initialization(view, init_s, loop_s, job_s))
        loop.blocks.append(Paragraph(
            f"The training loop then lasted {duration(loop_s)}, {num(percent(loop_s, job_s), 0)} % of the job. "
            "The analyses below cover it."))
    else:
        loop.blocks.append(Paragraph(
            f"The training loop lasted {duration(loop_s)}, which is {num(percent(loop_s, job_s), 0)} % of the "
            "training job's time. Since the training loop has taken the most time, the following sections dive "
            "into what happened during it."))
        if view is not None and view.triggered:  # fired, yet the loop was longer still: say it here
            loop.blocks.append(_init_verdict(view, init_s))
    sections.append(loop)
    return sections


def _no_steps(view: RuleResult | None, failed: str | None = None) -> str:
    if failed:
        return (f"No training step was recorded: {failed}, so there is no training loop to analyze. The analyses of "
                "system metrics below cover what ran until then.")
    if view is not None and view.status == "not_applicable" and view.message.startswith("no framework data"):
        return ("No training step was recorded (the run has no framework data), so the training loop's bounds are "
                "unknown. The analyses of system metrics below cover the whole job; those that need framework data "
                f"say so. {HOW_TO_RECORD}")
    why = f" ({view.message})" if view is not None and view.message else ""
    return (f"No training step was recorded{why}, so the training loop's bounds are unknown. The analyses below "
            "cover the whole job.")


def _initialization(view: RuleResult, init_s: float, loop_s: float, job_s: float) -> Section:
    threshold = view.parameters.get("threshold")
    sec = Section("initialization", "Analyzing initialization", level=2)
    sec.blocks.append(Paragraph(
        f"The initialization phase (from the job's start to its first step) took {duration(init_s)}, which is "
        f"{num(percent(init_s, job_s), 0)} % of the training job's time, longer than the training loop itself "
        f"({duration(loop_s)}). Since initialization took the most time, it is analyzed first."))
    sec.blocks.append(Paragraph(
        "The MaxInitializationTime rule detects when the training initialization takes too much time: it waits "
        f"until the first step is available and fires when that takes more than `threshold` minutes (here "
        f"{threshold} minutes). Initialization takes long when a whole data set is downloaded or preprocessed "
        "before training starts, or when the job waits for its peers or for a busy machine."))
    nodes = MaxInitializationTimeDetails.from_json(view.details).nodes
    if nodes:
        sec.blocks.append(Table(
            ["Node", "Node started", "First step", "Initialization [s]"],
            [[node, when(e.start_us), when(e.first_step), e.initialization_s]
             for node, e in nodes.items()],
            caption="When each node started and when its first step began"))
    sec.blocks.append(_init_verdict(view, init_s))
    return sec


def _init_verdict(view: RuleResult, init_s: float) -> Verdict:
    threshold = view.parameters.get("threshold")
    if view.triggered:
        return Verdict(f"The first step started {duration(init_s)} after the job started, more than the threshold of "
                       f"{threshold} minutes. Download or preprocess the data set ahead of the job, stream it instead "
                       "of copying it whole, or cache it between runs; check that no process waits for its peers.",
                       WARN)
    return Verdict(f"The first step started {duration(init_s)} after the job started, within the threshold of "
                   f"{threshold} minutes.", INFO)
