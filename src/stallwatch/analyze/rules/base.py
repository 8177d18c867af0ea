"""What every rule shares: declared parameters, incremental updates over chunks of new data, and the
result schema of RULES.md (SageMaker's keys, plus structured extras).

Evaluation points are defined by the data (each snapshot, window or step), never by when `update()` is
called, so feeding a run in one chunk or in many (live) ends with the same result."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Iterator, Protocol

import pyarrow as pa

from stallwatch.analyze.frames import NodeFrame
from stallwatch.analyze.results import ERROR, NOT_APPLICABLE, OK, RuleResult

__all__ = ["ERROR", "NOT_APPLICABLE", "OK", "Chunk", "NodeFrame", "ParameterError", "Rule", "RuleResult", "coerce"]


@dataclass
class Chunk:
    """What a rule is handed at each evaluation: the data that is new since the last one. (Rules may cache
    what they derive from it on the instance, outside the fields: see `steps.framework_columns`.)"""

    system: dict[str, NodeFrame]
    framework: pa.Table  # framework events (stallwatch.records.framework_schema), new since the last chunk
    run: dict[str, Any] = field(default_factory=dict)  # Run.info: run.json merged with every node's record
    final: bool = False  # the run has ended: nothing more will come
    # nodes whose data is complete with this chunk: no later chunk holds a row of theirs, so a rule may reduce
    # their per-step state to a summary now (batch feeds node by node; live leaves it empty until `final`)
    done: frozenset[str] = frozenset()
    # batch feeds only: the run read again in pieces (`Replay`), for a rule whose verdict compares ranks across
    # nodes step by step and so cannot reduce a finished node to a summary: it keeps where to look instead; None
    # when live
    replay: Replay | None = field(default=None, compare=False, repr=False)


class Replay(Protocol):
    """The run read again, piece by piece: for each (node, start µs, end µs) of `pieces`, in order, a chunk of
    that node's framework events of `kinds` (None: all) that start in [start, end) (node, rank and `fields`)."""

    def __call__(self, pieces: Iterable[tuple[str, int, int]], *, kinds: tuple[str, ...] | None,
                 fields: tuple[str, ...]) -> Iterator[Chunk]: ...


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
