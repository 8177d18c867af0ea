"""The rules summary as text, like the report's: most often fired first, with the headline sentence."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from stallwatch.analyze.results import NOT_APPLICABLE, RuleResult, by_times_fired, not_applicable_groups
from stallwatch.present.console import table


def headline(results: Sequence[RuleResult]) -> str:
    fired = [r for r in results if r.triggered > 0]
    if not fired:
        return "No rule was triggered: nothing stands out in this run."
    names = ", ".join(r.name for r in sorted(fired, key=lambda r: -r.triggered)[:3])
    return (f"{len(fired)} of {len(results)} rules were triggered; the most frequent: {names}. "
            "Their recommendations are below.")


def rules_table(results: Sequence[RuleResult], width: int = 100) -> str:
    ordered = by_times_fired(results)
    rows = []
    for r in ordered:
        status = "n/a" if r.status == NOT_APPLICABLE else ("ERROR" if r.status == "error" else str(r.triggered))
        params = " ".join(f"{k}:{v}" for k, v in r.parameters.items())
        rows.append([r.name, status, str(r.datapoints), params])
    lines = [headline(results), "", table(["rule", "triggered", "datapoints", "parameters"], rows, "lrrl"), ""]
    for reason, names in not_applicable_groups(ordered).items():
        lines.append(f"Not applicable: {', '.join(names)} — {reason}")
    for r in ordered:
        if r.status == NOT_APPLICABLE:
            continue
        elif r.status == "error":
            lines.append(f"{r.name}: could not be evaluated — {r.message}")
        elif r.triggered:
            lines.append(f"{r.name}: " + textwrap.shorten(r.recommendation, width=width * 3, placeholder=" …"))
    return "\n".join(lines).rstrip()
