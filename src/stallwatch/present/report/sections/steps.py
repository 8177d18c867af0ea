"""5. Step duration analysis: StepOutlier's statistics per node, rank and phase, a histogram of every step's
duration per node (log-spaced bins, the rule's outliers marked), and where the outlier steps spent their time."""

from __future__ import annotations

from typing import Any

from stallwatch import catalogue
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.step_outlier import StepOutlierDetails, StepSeries
from stallwatch.analyze.steps import NodeSteps
from stallwatch.present.charts import row
from stallwatch.present.report.model import GOOD, INFO, WARN, Chart, Paragraph, Section, Table, Verdict
from stallwatch.present.report.sections import _loop_charts as charts
from stallwatch.present.report.sections._loop import duration, num, rule_view, when

RULE = "StepOutlier"
TITLE = "Step duration analysis"
SLOWEST_LISTED = 10  # outlier steps named in the table of the slowest
SERIES_COMPARED = 10  # ranks and phases whose outlier steps are compared with their normal ones
# What StepOutlier's framework context calls each part of a step, in the order shown.
KIND_LABELS = {
    **{k: catalogue.label(k) for k in ("data_wait", "forward", "backward", "optimizer", "collective")},
    "other": catalogue.label("other_events"), "outside_phases": "outside the recorded phases (the loop's own code)",
}


def build(analysis: RunAnalysis) -> list[Section]:
    sec = Section("step-duration", TITLE, level=3)
    view, missing = rule_view(analysis, RULE, "the step duration analysis")
    if missing is not None:
        sec.blocks.append(missing)
        return [sec]
    assert view is not None
    details = StepOutlierDetails.from_json(view.details)
    series = details.series
    sec.blocks.append(Paragraph(_intro(view) + _excused(series)))
    sec.blocks.append(_stats_table(series))
    with_steps = sorted({e.node for e in series.values()})
    drawn = analysis.drawn_nodes(with_steps)
    histograms = analysis.step_histograms({e.phase for e in series.values()}, nodes=drawn)
    if histograms:
        sec.blocks.append(Paragraph(
            "The following histograms show the step durations measured on each node, one series per rank and "
            "phase, on a logarithmic axis so that slow steps and normal ones show together; the outliers are also "
            "marked as red triangles (hover for their step numbers). Click a label in the legend to hide its "
            "series." + _drawn_note(len(drawn), len(with_steps))))
    for hist in histograms:
        sec.blocks.append(Chart(_histogram(hist, series), caption=f"Step durations on node {hist.node}"))
    if any(e.number_of_outliers for e in series.values()):
        sec.blocks += _outlier_context(view, details)
    sec.blocks.append(_verdict(view, series))
    return [sec]


def _drawn_note(drawn: int, total: int) -> str:
    """What a per-node chart leaves out of a fleet (the table above has every node)."""
    if drawn >= total:
        return ""
    return (f" Histograms of {drawn} of the {total} nodes are drawn: those the findings name first, then those "
            "that stand out in the node comparison, then by name; the table above has every node.")


def _intro(view: RuleResult) -> str:
    p = view.parameters
    mode = p.get("mode")
    phases = (f"Only steps of the {mode} phase were checked." if mode else
              "Each phase (TRAIN, EVAL, GLOBAL) of each rank was checked on its own.")
    return (f"The StepOutlier rule measures step durations and checks for outliers: a step is an outlier when it "
            f"takes longer than the mean plus {p.get('stddev')} times the standard deviation of its rank's steps of "
            f"the same phase. {phases} Typically the first steps take significantly more time; so that they do not "
            f"make the rule fire at once, it ignores up to n_outliers = {p.get('n_outliers')} outliers per rank and "
            f"phase. The rule analyzed {view.datapoints} steps and fired for {view.triggered} rank and phase "
            f"series, with {view.violations} outlier steps in them.")


def _excused(series: dict[str, StepSeries]) -> str:
    """How many steps over the threshold were not counted: their intra-op threads' wait for a CPU explains them."""
    excused = sum(e.outliers_waiting_for_cpu for e in series.values())
    if not excused:
        return ""
    return (f" {excused} more step{'s were' if excused != 1 else ' was'} above the threshold only by the time the "
            "job's intra-op threads waited for a CPU (the training thread waits for them at each parallel "
            "operation): the machine's slowdown, which CPU contention names, not the job's, so not counted.")


def ms(seconds: float | None) -> float | None:
    """Seconds (as the rule reports them) in milliseconds, the unit step tables show."""
    return None if seconds is None else seconds * 1000.0


def _stats_table(series: dict[str, StepSeries]) -> Table:
    rows = []
    for e in series.values():
        s = e.step_stats
        rows.append([e.node, e.rank, e.phase, e.steps, *(ms(v) for v in (s.mean, s.max, s.p99, s.p95, s.p50, s.min)),
                     ms(e.stddev), ms(e.outlier_threshold), e.number_of_outliers, "yes" if e.triggered else "no"])
    return Table(["Node", "Rank", "Phase", "Steps", "Mean [ms]", "Max [ms]", "p99 [ms]", "p95 [ms]", "p50 [ms]",
                  "Min [ms]", "Std dev [ms]", "Outlier above [ms]", "Outliers", "Fired"], rows,
                 caption="Step durations per node, rank and phase")


def _histogram(hist: NodeSteps, series: dict[str, StepSeries]) -> Any:
    bars = [(f"rank {r} {m}", share, hist.edges) for (r, m), share in hist.shares.items()]
    markers = [(_label(e), e.outliers, [f"step {n}" for n in e.step_numbers])
               for e in series.values() if e.node == hist.node and e.outliers]
    return charts.histogram(f"Step durations on node {hist.node}", "Step duration in s (log scale)", bars,
                            y_label="Share of the series' steps", markers=markers, marker_label="outlier",
                            log_x=True)


def _label(e: StepSeries) -> str:
    return f"rank {e.rank} {e.phase}"


def _outlier_context(view: RuleResult, details: StepOutlierDetails) -> list[Any]:
    series = details.series
    blocks: list[Any] = [Paragraph(
        "To get a better understanding of what may have caused the outliers, the steps' own framework events "
        "show where their time went: the table compares the mean time per step in each phase of the outlier steps "
        "with the normal steps of the same rank and phase. Time outside the recorded phases is the training "
        "loop's own code between them (logging, metrics, host-side work, synchronization).")]
    rows = []
    with_outliers = sorted((e for e in series.values() if e.number_of_outliers), key=lambda e: -e.number_of_outliers)
    for e in with_outliers[:SERIES_COMPARED]:
        slow, normal = e.framework_context.outlier_steps, e.framework_context.normal_steps
        for kind, label in KIND_LABELS.items():
            if kind in slow or kind in normal:
                a, b = slow.get(kind, 0.0), normal.get(kind, 0.0)
                rows.append([e.node, e.rank, e.phase, label, ms(a), ms(b), ms(a - b)])
    if rows:
        among = (f" (the {SERIES_COMPARED} ranks and phases with the most outliers, of {len(with_outliers)})"
                 if len(with_outliers) > SERIES_COMPARED else "")
        blocks.append(Table(["Node", "Rank", "Phase", "Where the time went", "Outlier steps [ms]",
                             "Normal steps [ms]", "Difference [ms]"], rows,
                            caption=f"Mean time per step in each phase{among}"))
    slowest = sorted(((d, e, n, t) for e in series.values() for d, n, t in e.listed()),
                     key=lambda x: -x[0])[:SLOWEST_LISTED]
    if slowest:
        blocks.append(Table(["Node", "Rank", "Phase", "Step", "Duration [ms]", "Started"],
                            [[e.node, e.rank, e.phase, n, ms(d), when(t)]
                             for d, e, n, t in slowest],
                            caption=f"The {len(slowest)} slowest outlier steps"))
    phase, parts = details.phase, details.forward_backward
    if view.triggered and (phase or parts):
        top = max(parts.items(), key=lambda kv: kv[1]) if parts else None
        text = "Over the outlier steps of the series that fired"
        if top:
            text += f", {num(top[1], 0)} % of their time went to {KIND_LABELS.get(top[0], top[0])}"
        if len(phase) == 1:
            text += f", all of it in {next(iter(phase))} steps"
        if len(phase) > 1 or len(parts) > 1:  # a pie of one slice is this sentence, not a chart
            text += "; the charts show the share of their time per phase and per part of the step"
        blocks.append(Paragraph(text + "."))
        pies = [charts.pie("Outlier time per phase", phase)] if len(phase) > 1 else []
        if len(parts) > 1:
            pies.append(charts.pie("Outlier time per part of the step",
                                   {KIND_LABELS.get(k, k): v for k, v in parts.items()}))
        if pies:
            blocks.append(Chart(row(*pies), caption="Where the outlier steps spent their time"))
    return blocks


def _verdict(view: RuleResult, series: dict[str, StepSeries]) -> Verdict:
    n = view.parameters.get("n_outliers")
    if view.triggered:
        return Verdict(view.recommendation, WARN)
    outliers = sum(e.number_of_outliers for e in series.values())
    if outliers:
        return Verdict(f"{outliers} outlier steps in all, but no rank and phase had more than {n}: occasional slow "
                       "steps (such as the first ones) are expected.", INFO)
    means = [e.step_stats.mean for e in series.values() if e.step_stats.mean is not None]
    low, high = (duration(min(means)), duration(max(means))) if means else ("", "")
    typical = "" if not means else f" (mean step {low})" if low == high else f" (mean step {low} to {high})"
    return Verdict(f"No outlier steps: step durations were stable{typical}.", GOOD)
