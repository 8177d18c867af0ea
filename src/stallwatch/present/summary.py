"""`stallwatch summary RUN`: for any run, the text `stallwatch run` prints when its job ends — the run's span,
fate and usage, its steps, the rules' summary and what to fix first."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.price import RunCost, money
from stallwatch.analyze.usage import NodeSpan
from stallwatch.present.console import findings_text, run_summary
from stallwatch.present.rules_table import rules_table


def summary_text(analysis: RunAnalysis, node: str | None = None) -> str:
    s = analysis.summary
    nodes = [node] if node else analysis.nodes
    spans, stats = [], []
    for name in nodes:
        frame = analysis.system(name, ())
        if len(frame):
            spans.append(NodeSpan(name, len(frame), int(frame.timestamps.min()), int(frame.timestamps.max())))
        stats += analysis.usage(name)
    intervals = {s.sample_interval_ms.get(n) for n in nodes}
    head = run_summary(run_uri=s.uri, exit_code=s.fate.code if s.fate.code is not None else -1,
                       start_us=s.start_us or 0, end_us=s.last_us or s.start_us or 0, spans=spans, stats=stats,
                       sample_interval_ms=intervals.pop() if len(intervals) == 1 else None,
                       steps=analysis.step_stats(node),
                       windows=[w for w in analysis.profiles() if node is None or w.get("node") == node],
                       exit_signal=s.fate.signal, interrupted=s.fate.interrupted, notes=s.notes,
                       gpu=analysis.has_gpus, jobs=[j for n in nodes if (j := analysis.job_usage(n)) is not None],
                       interval_changes={n: r.interval_changes for n, r in analysis.node_records.items()})
    if s.fate.state == "running":
        head = head.replace(f"command exit code {-1}", "command still running", 1)
    parts = [head, rules_table(analysis.rule_results), findings_text(analysis.findings)]
    if analysis.cost is not None:
        parts.append(cost_text(analysis.cost))
    return "\n\n".join(parts)


def cost_text(cost: RunCost) -> str:
    """The cost line and the right-sizing advice, for the terminal."""
    lines = [f"Cost: {cost.line()}"]
    for advice in cost.advice:
        saving = (f" — saves about {money(advice.saving)} per run ({advice.saving_pct:.0f} %)"
                  if advice.saving is not None and advice.saving_pct is not None else "")
        lines.append(f"  • {advice.title}{saving}\n    evidence: {advice.evidence}")
    return "\n".join(lines)
