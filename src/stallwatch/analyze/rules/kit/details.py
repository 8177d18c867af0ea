"""Typed views of a rule's Details: each rule declares a record (a dataclass of `DetailsRecord`) whose fields are
the keys it writes, with their units; presenters read the record, never the dict. The JSON on disk keeps
SageMaker's shape and keys: a record is read from it (`from_json`), it does not write it.

A stored result is untrusted input (an old version, another tool, a hand edit): a key that is missing or of another
type reads as the field's default, never as an exception in a presenter. `json_key` names a key that is not a
Python name ("CPU memory"); `rest=True` gathers the dict-valued keys no other field claims (SageMaker's
`Details[node]` beside run-wide keys)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, ClassVar, Mapping, TypeVar

R = TypeVar("R", bound="DetailsRecord")

_HINTS: dict[type, dict[str, Any]] = {}


def json_key(name: str, default: Any = None, **kw: Any) -> Any:
    """A field stored under `name` in the JSON (a key that is not a Python name, or a clearer field name)."""
    return _field(default, {"json_key": name}, **kw)


def rest(**kw: Any) -> Any:
    """A field gathering every dict-valued key the record's other fields do not name (Details keyed by node)."""
    return _field(None, {"rest": True}, default_factory=dict, **kw)


def _field(default: Any, meta: dict[str, Any], default_factory: Any = None) -> Any:
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class DetailsRecord:
    """Base of the typed Details records (and their nested entries): `from_json` reads one tolerantly."""

    rule: ClassVar[str] = ""  # the rule whose Details this is (nested entries leave it empty)

    @classmethod
    def json_keys(cls) -> dict[str, str]:
        """Field name → JSON key, for the fields read from a key of their own (not `rest`)."""
        return {f.name: f.metadata.get("json_key", f.name) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                if not f.metadata.get("rest")}

    @classmethod
    def from_json(cls: type[R], data: Any) -> R:
        """The record read from a stored Details (or nested entry); anything unreadable reads as the default."""
        data = data if isinstance(data, Mapping) else {}
        hints = _hints(cls)
        values: dict[str, Any] = {}
        claimed = set(cls.json_keys().values())
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            hint = hints[f.name]
            if f.metadata.get("rest"):
                values[f.name] = _read({k: v for k, v in data.items() if k not in claimed and isinstance(v, Mapping)},
                                       hint)
                continue
            name = f.metadata.get("json_key", f.name)
            if name in data:
                value = _read(data[name], hint)
                if value is not _BAD:
                    values[f.name] = value
        return cls(**values)


_BAD = object()


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _read(value: Any, hint: Any) -> Any:
    """`value` as `hint` says, or _BAD."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            out = _read(value, arg)
            if out is not _BAD:
                return out
        return _BAD
    if origin is list:
        (arg,) = typing.get_args(hint) or (Any,)
        if not isinstance(value, list):
            return _BAD
        items = [_read(v, arg) for v in value]
        return [v for v in items if v is not _BAD]
    if origin is dict:
        _, arg = typing.get_args(hint) or (str, Any)
        if not isinstance(value, Mapping):
            return _BAD
        items = {str(k): _read(v, arg) for k, v in value.items()}
        return {k: v for k, v in items.items() if v is not _BAD}
    if origin is tuple:
        return tuple(value) if isinstance(value, list) else _BAD
    if isinstance(hint, type) and issubclass(hint, DetailsRecord):
        return hint.from_json(value) if isinstance(value, Mapping) else _BAD
    if hint is bool:
        return value if isinstance(value, bool) else _BAD
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _BAD
    if hint is float:  # a number as stored: an int stays an int (JSON written again reads the same)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return value if ok else _BAD
    if hint is str:
        return value if isinstance(value, str) else _BAD
    return _BAD


def flatten(record: Any) -> Any:
    """A record as plain values keyed by JSON key (what it read; `rest` fields spread back): for comparing a record
    with the Details it was read from."""
    if isinstance(record, DetailsRecord):
        out: dict[str, Any] = {}
        keys = type(record).json_keys()
        for f in dataclasses.fields(record):  # type: ignore[arg-type]
            value = flatten(getattr(record, f.name))
            if f.metadata.get("rest"):
                out.update(value)
            else:
                out[keys[f.name]] = value
        return out
    if isinstance(record, dict):
        return {k: flatten(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return [flatten(v) for v in record]
    return record


def number(value: Any) -> float | None:
    """A finite number or None (for a field typed `Any` that a presenter reads as a number)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


@dataclasses.dataclass(frozen=True)
class BoxStats(DetailsRecord):
    """Box-plot statistics of a series of percentages (%, `Distribution.box_stats`): quartiles, p95 and the
    whiskers (at most 1.5 IQR beyond the box). Empty (all None) where the series had no value."""

    p25: float | None = None
    p50: float | None = None
    p75: float | None = None
    p95: float | None = None
    upper: float | None = None
    lower: float | None = None

    def as_box(self) -> dict[str, float]:
        """The statistics a box plot draws (only those present)."""
        return {k: v for k, v in (("p25", self.p25), ("p50", self.p50), ("p75", self.p75), ("p95", self.p95),
                                  ("upper", self.upper), ("lower", self.lower)) if v is not None}


@dataclasses.dataclass(frozen=True)
class Coverage(DetailsRecord):
    """What the kit writes into any rule's Details: the nodes left out for lack of the data the rule needs
    (`not_applicable`, node → why: kit/windows.note_skipped), and `nothing_to_compare`, a rule that applies but can
    never judge this run however long it is (LoadBalancing where every node has one GPU)."""

    not_applicable: dict[str, str] = dataclasses.field(default_factory=dict)
    nothing_to_compare: bool = False


@dataclasses.dataclass(frozen=True)
class GenericDetails(DetailsRecord):
    """The keys any rule may write for a finding without a translation of its own (a custom rule: RULES.md,
    "Findings"): the time at stake (s), the nodes, ranks ("node/rank") and step numbers concerned, and a title."""

    time_at_stake_s: float | None = None
    nodes: list[str] = dataclasses.field(default_factory=list)
    ranks: list[str] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)
    title: str | None = None
