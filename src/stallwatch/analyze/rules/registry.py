"""Which rules exist: the built-ins, and rules a user registers (a Rule subclass)."""

from __future__ import annotations

from stallwatch.analyze.rules.base import ParameterError, Rule

_custom: dict[str, type[Rule]] = {}


def builtin_rules() -> list[type[Rule]]:
    """The built-in rules, in the report's order."""
    from stallwatch.analyze.rules import builtin

    return list(builtin.RULES)


def register_rule(cls: type[Rule]) -> type[Rule]:
    """Make a user's rule run like a built-in (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Rule)) or not cls.name:
        raise ParameterError("a custom rule is a stallwatch.analyze.rules.Rule subclass with a name")
    _custom[cls.name] = cls
    return cls


def all_rules() -> list[type[Rule]]:
    return builtin_rules() + [c for n, c in _custom.items() if n not in {r.name for r in builtin_rules()}]


def get_rule(name: str) -> type[Rule]:
    for cls in all_rules():
        if cls.name.lower() == name.lower():
            return cls
    raise ParameterError(f"no rule named {name!r}; rules: {', '.join(c.name for c in all_rules())}")
