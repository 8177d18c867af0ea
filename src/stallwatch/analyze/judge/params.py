"""The rule parameters a run is judged by again: those it was recorded with (its config's `rule_params`, the
`--param`s of `stallwatch run`), each overridden by the ones given now. Evaluating a run again without `--param`
must tell the story its own evaluation told, not the defaults'."""

from __future__ import annotations

from typing import Any, Sequence

from stallwatch.log import warn_once


def run_rule_params(location: Any, known: Sequence[Any], given: dict[str, dict[str, Any]] | None = None
                    ) -> dict[str, dict[str, Any]]:
    """{rule: {parameter: value}}: the run's own parameters, then `given` over them key by key. The run's are
    data from a run directory: each one that does not parse, names no rule here or does not validate is said once
    and left out (the rule keeps its default for it)."""
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.rules.registry import parse_params
    from stallwatch.store import run_files

    merged: dict[str, dict[str, Any]] = {}
    try:
        recorded = run_files.config_or_default(location).rule_params
    except Exception as exc:  # a run that cannot be read is reported by whatever reads it next
        warn_once("run-rule-params", "the run's rule parameters cannot be read (%s: %s); defaults assumed",
                  type(exc).__name__, exc)
        recorded = ()
    for text in recorded:
        try:
            for rule, values in parse_params([text], list(known)).items():
                merged.setdefault(rule, {}).update(values)
        except ParameterError as exc:
            warn_once(f"run-rule-param-{text[:80]}", "the run's rule parameter is left out (%s)", exc)
    for rule, values in (given or {}).items():
        merged.setdefault(rule, {}).update(values)
    for cls in known:  # the run's and the given ones together must still make the rule (a low above a high …)
        if cls.name in merged:
            try:
                cls(**merged[cls.name])
            except (ParameterError, TypeError, ValueError) as exc:
                warn_once(f"run-rule-params-{cls.name}", "the run's parameters for %s are left out (%s)",
                          cls.name, exc)
                merged[cls.name] = dict((given or {}).get(cls.name, {}))
                if not merged[cls.name]:
                    del merged[cls.name]
    return merged
