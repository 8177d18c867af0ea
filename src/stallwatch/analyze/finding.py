"""One finding: a problem a rule found, with its evidence, where it was seen, the training time at stake and the change
to try. Each rule translates its own result into findings (its `findings` method, beside its typed Details); the
ranking and the verdict are analyze/findings.py's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.summary import JobSummary

HIGH, MEDIUM, LOW = "high", "medium", "low"
SEVERITIES = (HIGH, MEDIUM, LOW)
HIGH_SHARE, MEDIUM_SHARE = 0.20, 0.05  # of the training loop's time at stake
LISTED_STEPS = 20
LISTED_WINDOWS = 20


@dataclass(frozen=True)
class Where:
    """Where a finding was seen: nodes, ranks ("node/rank"), step numbers and time windows (µs)."""
    nodes: list[str] = field(default_factory=list)
    ranks: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    windows: list[tuple[int, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "ranks": list(self.ranks), "steps": list(self.steps),
                "windows": [list(w) for w in self.windows]}


@dataclass(frozen=True)
class Finding:
    """A problem a rule found; its id is "rule-slug/key", unique in a run."""
    id: str
    rule: str
    severity: str
    title: str
    time_at_stake_s: float | None  # training time a fix could recover (an estimate); None where not a time
    share_of_loop: float | None  # time at stake / training loop
    where: Where
    evidence: dict[str, Any]
    recommendation: str
    share_of: str = "loop"  # what share_of_loop is a share of: "loop", or "job" for time outside the loop

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "rule": self.rule, "severity": self.severity, "title": self.title,
                "time_at_stake_s": rounded(self.time_at_stake_s), "share_of_loop": rounded(self.share_of_loop, 4),
                "share_of": self.share_of,
                "where": self.where.to_json(), "evidence": self.evidence, "recommendation": self.recommendation}


def share_text(share: float | None, of: str = "loop") -> str | None:
    """A finding's share of the loop (or of the job, for time outside the loop) in words; a stake longer than
    the loop (system windows that include the start-up) is said so instead of "127 %"."""
    if share is None:
        return None
    return f"{100 * share:.0f} % of the {of}" if share <= 1.0 else f"more than the {of}: time outside it counts"


def finding(result: RuleResult, summary: JobSummary, key: str, title: str, stake_s: float | None, where: Where,
            evidence: dict[str, Any], recommendation: str | None = None, severity: str | None = None) -> Finding:
    loop = summary.loop_s
    share = stake_s / loop if stake_s is not None and loop > 0 else None
    if severity is None:
        severity = LOW if share is None else HIGH if share >= HIGH_SHARE else MEDIUM if share >= MEDIUM_SHARE else LOW
    return Finding(f"{slug(result.name)}/{key}", result.name, severity, title, stake_s, share, where,
                   plain(evidence), recommendation or result.recommendation)


def over_all_steps(stake: Any, s: JobSummary) -> float | None:
    """A time at stake summed over steps, for all of them: where steps were sampled (analyze/sampled.py) the
    rule saw the timed ones only, which ran in a share `timed_share` of the ranks' loop time."""
    if not isinstance(stake, (int, float)) or isinstance(stake, bool):
        return None
    return float(stake) / s.timed_share if 0 < s.timed_share < 1 else float(stake)



def slug(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and (not name[i - 1].isupper() or (i + 1 < len(name) and name[i + 1].islower())):
            out.append("-")
        out.append(ch.lower())
    return "".join(out)


def pct(value: Any) -> str:
    return f"{float(value):.0f} %" if isinstance(value, (int, float)) else "much"


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


def strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def ints(value: Any) -> list[int]:
    return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, list) else []


def plain(value: Any) -> Any:
    """Evidence as plain JSON values (numpy scalars and tuples included)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value
