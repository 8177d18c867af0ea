"""This run against a baseline (`stallwatch report RUN --baseline BASELINE`): step-time distributions per mode
side by side, the phase breakdown, utilization, findings that appeared or went away, and per-operator time
where both runs have detailed windows."""

from __future__ import annotations

from stallwatch import catalogue
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.compare import QUANTILES, Pair
from stallwatch.present.report.model import GOOD, INFO, ISSUE, WARN, Block, Paragraph, Section, Table, Verdict

SECTION_ID = "comparison"
TITLE = "Compared with the baseline"


def build(analysis: RunAnalysis) -> list[Section]:
    c = analysis.comparison
    if c is None:
        return []
    blocks: list[Block] = [Paragraph(f"Baseline: {c.baseline_uri}. This run: {c.run_uri}.")]
    slower = c.slower_pct()
    if slower is not None:
        level = ISSUE if slower > 5 else GOOD if slower < -5 else INFO
        word = "slower" if slower > 0 else "faster"
        blocks.append(Verdict(f"The median training step is {abs(slower):.1f} % {word} than the baseline's.", level))
    blocks += [Verdict(note, WARN) for note in c.notes]
    rows = []
    for mode, (base, run) in c.step_times.items():
        for label, pick in [("steps", lambda t: t.steps), ("mean (ms)", lambda t: t.mean_ms)] + [
                (f"p{round(q * 100)} (ms)", lambda t, q=q: t.at(q)) for q in QUANTILES]:
            rows.append(_row(f"{mode} {label}", Pair(label, None if base is None else pick(base),
                                                     None if run is None else pick(run))))
    blocks.append(Table(["step time", "baseline", "this run", "change"], rows, "Step time per mode"))
    for mode, phases in c.phases.items():
        blocks.append(Table(["phase", "baseline (% of step)", "this run (% of step)", "change"],
                            [_row(catalogue.label(p.name), p) for p in phases], f"Where a {mode} step's time went"))
    if c.utilization:
        blocks.append(Table(["utilization (mean, %)", "baseline", "this run", "change"],
                            [_row(p.name, p) for p in c.utilization], "Utilization, mean over nodes"))
    findings = [[t, "appeared"] for t in c.findings_appeared] + [[t, "went away"] for t in c.findings_gone] + \
        [[t, "in both"] for t in c.findings_kept]
    blocks.append(Table(["finding", ""], findings, "Findings") if findings else
                  Paragraph("Neither run has findings."))
    if c.operators:
        blocks.append(Table(["operator", "baseline (µs/step)", "this run (µs/step)", "change"],
                            [_row(p.name, p) for p in c.operators], "Operator self time per profiled step"))
    return [Section(SECTION_ID, TITLE, blocks)]


def _row(label: str, pair: Pair) -> list[object]:
    change = pair.change_pct
    return [label, "–" if pair.baseline is None else pair.baseline, "–" if pair.run is None else pair.run,
            "–" if change is None else f"{change:+.1f} %"]
