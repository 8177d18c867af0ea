"""A rule's result as one typed value: what the rules produce and every renderer, the findings and the
dashboard consume. The SageMaker-compatible JSON of RULES.md is its serialised form, written into the run
(`to_json`) and read back — from this run or from any file of that schema — through one `from_json`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

OK, NOT_APPLICABLE, ERROR = "ok", "not_applicable", "error"
STATUSES = (OK, NOT_APPLICABLE, ERROR)


@dataclass
class RuleResult:
    """One rule's verdict on a run: how often it fired, on how many datapoints, with its parameters, texts and
    the rule-specific `details` (RULES.md describes each rule's keys)."""

    name: str
    triggered: int
    violations: int
    datapoints: int
    parameters: dict[str, Any]
    description: str
    recommendation: str
    details: dict[str, Any] = field(default_factory=dict)
    status: str = OK
    message: str = ""
    imported: bool = False  # read from a file this stallwatch did not compute (e.g. SageMaker's own rule output)

    @property
    def fired(self) -> bool:
        return self.status == OK and self.triggered > 0

    @property
    def applies(self) -> bool:
        return self.status == OK

    def to_json(self) -> dict[str, Any]:
        out = {
            "RuleName": self.name,
            "RuleTriggered": self.triggered,
            "Violations": self.violations,
            "Datapoints": self.datapoints,
            "RuleParameters": "\n".join(f"{k}:{_text(v)}" for k, v in self.parameters.items()),
            "Parameters": dict(self.parameters),
            "Description": self.description,
            "Recommendation": self.recommendation,
            "Details": self.details,
            "Status": self.status,
            "Message": self.message,
        }
        if self.imported:
            out["Imported"] = True
        return out

    @classmethod
    def from_json(cls, record: Mapping[str, Any], *, default_name: str = "?") -> RuleResult:
        """A result from its JSON form (ours, or SageMaker's files, which lack `Parameters` and `Status`).
        Untrusted input: every field is coerced to its type, anything unusable becomes its empty value."""
        if not isinstance(record, Mapping):
            raise ValueError(f"a rule result is a JSON object, not {type(record).__name__}")
        params = record.get("Parameters")
        if not isinstance(params, Mapping):
            params = _parse_parameters(record.get("RuleParameters"))
        status = str(record.get("Status") or OK)
        return cls(name=_str(record.get("RuleName")) or default_name,
                   triggered=_count(record.get("RuleTriggered")), violations=_count(record.get("Violations")),
                   datapoints=_count(record.get("Datapoints")),
                   parameters={str(k): v for k, v in params.items()},
                   description=_str(record.get("Description")), recommendation=_str(record.get("Recommendation")),
                   details=dict(record["Details"]) if isinstance(record.get("Details"), Mapping) else {},
                   status=status if status in STATUSES else ERROR, message=_str(record.get("Message")),
                   imported=bool(record.get("Imported", False)))


def _text(value: Any) -> str:
    return "None" if value is None else str(value)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _count(value: Any) -> int:
    """A non-negative count from untrusted JSON (a float, a numeric string, garbage -> 0)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) and 0 <= number < 2**63 else 0


def _parse_parameters(text: Any) -> dict[str, Any]:
    """SageMaker's `RuleParameters` string ("name:value" per line) as a dict of strings."""
    if not isinstance(text, str):
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def by_times_fired(results: list[RuleResult]) -> list[RuleResult]:
    """The order every rules summary uses (console, report, dashboard): most often fired first, then by name."""
    return sorted(results, key=lambda r: (-r.triggered, r.name))


def not_applicable_groups(results: list[RuleResult]) -> dict[str, list[str]]:
    """Reason -> the rules that do not apply for it, so the same reason (e.g. a CPU-only run) is said once."""
    groups: dict[str, list[str]] = {}
    for r in results:
        if r.status == NOT_APPLICABLE:
            groups.setdefault(r.message.replace(r.name, "the rule"), []).append(r.name)
    return groups
