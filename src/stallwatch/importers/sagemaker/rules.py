"""SageMaker's rule reports (`…/profiler-output/profiler-reports/<RuleName>.json`) -> the run's rules/.

Their keys are the ones RULES.md's schema keeps (RuleTriggered, Violations, Datapoints, RuleParameters,
Details), so they are stored as they are — under `rules/SageMaker.<RuleName>.json`, RuleName likewise, with
`Imported` saying where they came from. SageMaker computed them: stallwatch's own rules, evaluated on the
imported data by `stallwatch rules`, write `rules/<RuleName>.json` beside them and never replace them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from stallwatch.importers.sagemaker.discovery import RuleReport
from stallwatch.store import run_files

PREFIX = "SageMaker."
MAX_BYTES = 16 * 2**20
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}$")


@dataclass
class RuleStats:
    imported: list[str] = field(default_factory=list)  # rule names
    skipped: list[str] = field(default_factory=list)  # "path: why"


def import_rules(reports: list[RuleReport], sink: Any) -> RuleStats:
    stats = RuleStats()
    seen: set[str] = set()
    for report in reports:
        why = _why_not(report, seen)
        if why:
            stats.skipped.append(f"{report.path}: {why}")
            continue
        try:
            with report.location.open_input_stream(report.path) as fh:
                data = fh.read(MAX_BYTES + 1)
            record = json.loads(data)
        except (ValueError, RecursionError, OSError) as exc:
            stats.skipped.append(f"{report.path}: not readable JSON ({str(exc).splitlines()[0][:120]})")
            continue
        if not isinstance(record, dict):
            stats.skipped.append(f"{report.path}: not a JSON object")
            continue
        name = PREFIX + report.name
        converted = imported_record(record, report.name, report.path)
        run_files.write_rule_result(sink, name, converted)
        seen.add(report.name)
        stats.imported.append(report.name)
    return stats


def imported_record(record: dict[str, Any], rule: str, path: str) -> dict[str, Any]:
    """SageMaker's result with RULES.md's keys filled in where it has none, marked as imported."""
    out = dict(record)
    out["RuleName"] = PREFIX + rule
    out.setdefault("Description", f"Computed by SageMaker Debugger's {rule} rule during the training job "
                                  "(imported; stallwatch's own rule is evaluated by `stallwatch rules`).")
    out.setdefault("Recommendation", "")
    out.setdefault("Details", {})
    out.setdefault("Status", "ok")
    out.setdefault("Message", "")
    for key in ("RuleTriggered", "Violations", "Datapoints"):
        try:
            out[key] = int(out.get(key) or 0)
        except (TypeError, ValueError):
            out[key] = 0
    out["Imported"] = {"from": "SageMaker Debugger", "rule": rule, "source": path}
    return out


def _why_not(report: RuleReport, seen: set[str]) -> str | None:
    if not _NAME.match(report.name):
        return "its name cannot name a rule result"
    if report.name in seen:
        return f"a second report of {report.name} (the first one found was imported)"
    if report.size > MAX_BYTES:
        return f"larger than {MAX_BYTES // 2**20} MB"
    return None
