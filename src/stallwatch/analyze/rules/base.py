"""What every rule shares: declared parameters, incremental updates over chunks of new data, and the
result schema of RULES.md (SageMaker's keys, plus structured extras).

Evaluation points are defined by the data (each snapshot, window or step), never by when `update()` is
called, so feeding a run in one chunk or in many (live) ends with the same result."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from stallwatch.analyze.frames import Chunk, NodeFrame, Replay
from stallwatch.analyze.results import ERROR, NOT_APPLICABLE, OK, RuleResult

if TYPE_CHECKING:
    from stallwatch.analyze.finding import Finding
    from stallwatch.analyze.summary import JobSummary

__all__ = [
    "ERROR", "NOT_APPLICABLE", "OK", "Chunk", "NodeFrame", "ParameterError", "Replay", "Rule", "RuleResult", "coerce",
]


class ParameterError(ValueError):
    """A rule parameter that is unknown or of the wrong type; the message names it and what is allowed."""


class Rule:
    """Subclasses set `name`, `description`, `recommendation`, `defaults` (ordered: RULES.md's order) and
    implement `update(chunk)` and `result()`. One instance per evaluation of a run.

    `metrics` names the system metrics (the `metric` part of `device/metric` columns) the rule reads from
    its NodeFrames, so a reader can leave the others out; None (the default) means it may read any, and
    () that it reads none (timestamps and `info` are always there)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    recommendation: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    metrics: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, **params: Any) -> None:
        self.params = dict(self.defaults)
        for key, value in params.items():
            if key not in self.defaults:
                raise ParameterError(f"{self.name} has no parameter {key!r}; its parameters: "
                                     f"{', '.join(self.defaults) or 'none'}")
            self.params[key] = coerce(self.name, key, value, self.defaults[key])

    def update(self, chunk: Chunk) -> None:
        raise NotImplementedError

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), from its own typed Details: each rule translates
        its own. A rule that does not gets analyze/findings.py's generic finding when it fires."""
        raise NotImplementedError

    @classmethod
    def translates(cls) -> bool:
        """Whether this rule has a translation into findings of its own."""
        return cls.findings.__func__ is not Rule.findings.__func__  # type: ignore[attr-defined]

    def result(self) -> RuleResult:
        raise NotImplementedError

    def merge(self, other: Rule, node: str) -> None:
        """Fold in `other`, this rule with the same parameters fed from new only `node`'s chunks of a batch feed
        (every other node present in them with no rows; the last with `done={node}`), so that this rule is as if
        it had been fed them itself after what it was fed. Lets the nodes be fed on an engine's workers
        (`by_node`); a rule that does not implement it is fed every chunk in the calling process."""
        raise NotImplementedError

    @classmethod
    def merges(cls) -> bool:
        """Whether this rule implements `merge`."""
        return cls.merge is not Rule.merge

    def make_result(self, *, triggered: int, violations: int, datapoints: int, details: dict[str, Any],
                    status: str = OK, message: str = "", recommendation: str | None = None) -> RuleResult:
        return RuleResult(self.name, int(triggered), int(violations), int(datapoints), dict(self.params),
                          self.description, recommendation or self.recommendation, details, status, message)

    def not_applicable(self, reason: str, details: dict[str, Any] | None = None) -> RuleResult:
        return self.make_result(triggered=0, violations=0, datapoints=0, details=details or {},
                                status=NOT_APPLICABLE, message=reason)


def coerce(rule: str, key: str, value: Any, default: Any) -> Any:
    """A parameter value given as text (CLI, config) in the type of its default; a number whose default is a
    whole number may be fractional (`MaxInitializationTime.threshold=0.5` minutes): the rules that need a count
    (patience, window) check that it is one."""
    if not isinstance(value, str) or isinstance(default, str):
        if default is not None and isinstance(value, bool) != isinstance(default, bool):
            raise ParameterError(f"{rule}.{key}={value!r}: must be {type(default).__name__}")
        return value
    text = value.strip()
    if default is None or text.lower() == "none":
        return None if text.lower() in ("none", "") else text
    try:
        if isinstance(default, bool):
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if isinstance(default, (int, float)):
            number = float(text)
            if not math.isfinite(number):
                raise ValueError
            return int(text) if isinstance(default, int) and _is_integer_text(text) else number
    except ValueError:
        raise ParameterError(f"{rule}.{key}={value!r}: must be {_kind(default)} "
                             f"(default {default!r})") from None
    return text


def _is_integer_text(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _kind(default: Any) -> str:
    return "a number" if isinstance(default, (int, float)) and not isinstance(default, bool) else type(default).__name__
