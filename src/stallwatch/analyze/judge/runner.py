"""Evaluate rules over a run and write `rules/<RuleName>.json` atomically. A rule that fails is one
result with Status "error", never a failed evaluation of the others."""

from __future__ import annotations

import traceback
from typing import Any, Callable, Iterable

from stallwatch.analyze.rules.base import ERROR, Chunk, Rule, RuleResult
from stallwatch.log import logger
from stallwatch.store import run_files


def evaluate(rule_classes: Iterable[type[Rule]], chunks: Iterable[Chunk],
             params: dict[str, dict[str, Any]] | None = None, *,
             progress: Callable[[int], None] | None = None) -> list[RuleResult]:
    """Feed every chunk to every rule (in order, one chunk at a time: `chunks` may be a lazy reader) and
    collect the results. A rule that raises is left out of the later chunks and reports the error.
    `progress(chunks done)` after each chunk."""
    rules = make_rules(rule_classes, params)
    failed: dict[int, RuleResult] = {}
    for done, chunk in enumerate(chunks, 1):
        feed(rules, chunk, failed)
        if progress is not None:
            progress(done)
    return results_of(rules, failed)


def make_rules(rule_classes: Iterable[type[Rule]], params: dict[str, dict[str, Any]] | None) -> list[Rule]:
    """One instance of each rule with its parameters: a bad parameter raises before any work."""
    params = params or {}
    return [cls(**params.get(cls.name, {})) for cls in rule_classes]


def feed(rules: list[Rule], chunk: Chunk, failed: dict[int, RuleResult]) -> None:
    """`chunk` to each rule not in `failed`; a rule that raises joins `failed` (by its index)."""
    for i, rule in enumerate(rules):
        if i in failed:
            continue
        try:
            rule.update(chunk)
        except Exception as exc:  # one broken rule (a custom one, say) never hides the others' results
            failed[i] = failed_result(rule, exc)


def results_of(rules: list[Rule], failed: dict[int, RuleResult]) -> list[RuleResult]:
    """Each rule's result, or its failure."""
    results = []
    for i, rule in enumerate(rules):
        if i in failed:
            results.append(failed[i])
            continue
        try:
            results.append(rule.result())
        except Exception as exc:
            results.append(failed_result(rule, exc))
    return results


def failed_result(rule: Rule, exc: Exception) -> RuleResult:
    """What a rule that raised reports (said once in the log)."""
    logger.warning("rule %s failed: %s: %s", rule.name, type(exc).__name__, exc)
    return RuleResult(rule.name, 0, 0, 0, dict(rule.params), rule.description, rule.recommendation,
                      {"traceback": traceback.format_exc(limit=5)}, ERROR, f"{type(exc).__name__}: {exc}")


def write_results(location: Any, results: list[RuleResult]) -> list[str]:
    """`rules/<RuleName>.json` for each result, each written atomically (through the store); the paths written."""
    return [run_files.write_rule_result(location, r.name, r.to_json()) for r in results]
