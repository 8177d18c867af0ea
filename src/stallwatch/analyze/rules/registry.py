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


def load_custom(specs: tuple[str, ...] | list[str]) -> list[type[Rule]]:
    """Rules named as "module.path:Class" or "path/to/file.py:Class" (config `custom_rules`), registered."""
    import importlib
    import importlib.util
    import os

    out = []
    for spec in specs:
        where, _, name = spec.rpartition(":")
        try:
            if where.endswith(".py") or os.sep in where:
                module_spec = importlib.util.spec_from_file_location(f"stallwatch_custom_{abs(hash(where))}", where)
                if module_spec is None or module_spec.loader is None:
                    raise ImportError(f"cannot load {where}")
                module = importlib.util.module_from_spec(module_spec)
                module_spec.loader.exec_module(module)
            else:
                module = importlib.import_module(where)
            cls = getattr(module, name)
        except Exception as exc:
            raise ParameterError(f"custom rule {spec!r} cannot be loaded ({type(exc).__name__}: {exc})") from None
        out.append(register_rule(cls))
    return out


def parse_params(texts: tuple[str, ...] | list[str], known: list[type[Rule]]) -> dict[str, dict[str, str]]:
    """`RULE.parameter=value` texts (`--param`, config `rule_params`) as {rule name: {parameter: value}}, each
    checked against the rule's declared parameters: a wrong one raises ParameterError naming it."""
    params: dict[str, dict[str, str]] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        rule, dot, key = name.strip().partition(".")
        if not sep or not dot or not rule or not key:
            raise ParameterError(f"--param {text!r}: write RULE.parameter=value, e.g. CPUBottleneck.threshold=30")
        cls = next((c for c in known if c.name.lower() == rule.lower()), None)
        if cls is None:
            raise ParameterError(f"--param {text!r}: no rule named {rule!r}; rules: "
                                 f"{', '.join(c.name for c in known)}")
        params.setdefault(cls.name, {})[key.strip()] = value.strip()
    for cls in known:
        if cls.name in params:
            cls(**params[cls.name])  # a bad parameter is refused before anything is read
    return params
