"""Rules evaluated node by node on an engine's workers: each task feeds fresh rules one node's slices of the batch
feed, read on the worker from the run's URI, and sends the rules back; the caller merges them in the feed's order
(`Rule.merge`) and feeds them the final chunk, so the results are the single-process feed's. Rules that do not
merge (a custom rule, say) are fed the slices in the caller, as before."""

from __future__ import annotations

import uuid
from functools import partial
from itertools import groupby
from typing import Any, Callable, Iterable, Iterator

from stallwatch.analyze.framework_frame import framework_columns
from stallwatch.analyze.judge.feed import (
    RunReplay,
    ahead_of,
    empty_chunk,
    iter_run,
    plan,
    read_slice,
    rule_metrics,
    slice_length,
    worker_run,
)
from stallwatch.analyze.judge.runner import evaluate, failed_result, feed, make_rules, results_of
from stallwatch.analyze.rules.base import Chunk, Rule, RuleResult

NodeWork = tuple[str, list[tuple[int, int]]]  # a node and its time slices, in order


def evaluate_run(run: Any, rule_classes: Iterable[type[Rule]], params: dict[str, dict[str, Any]] | None = None, *,
                 engine: Any = None, slice_us: int | None = None,
                 progress: Callable[[int], None] | None = None) -> list[RuleResult]:
    """Evaluate the rules over a whole run on `engine`: in this process, chunk by chunk (`iter_run`), unless the
    engine has workers; then the rules that merge are fed node by node on them (`evaluate_by_node`) and the others
    the slices the workers read. `progress(slices done)` as `evaluate`'s."""
    classes = list(rule_classes)
    spread = [c for c in classes if c.merges()] if engine is not None and engine.name != "local" else []
    rest = [c for c in classes if c not in spread]
    make_rules(classes, params)  # a bad parameter raises before any work
    out: dict[int, RuleResult] = {}
    if spread:  # the slices' progress is said once: by the second pass when there is one
        for cls, result in zip(spread, evaluate_by_node(run, spread, params, engine=engine, slice_us=slice_us,
                                                        progress=None if rest else progress), strict=True):
            out[classes.index(cls)] = result
    if rest or not classes:
        for cls, result in zip(rest, evaluate(rest, iter_run(run, rest, engine=engine, slice_us=slice_us), params,
                                              progress=progress), strict=True):
            out[classes.index(cls)] = result
    return [out[i] for i in range(len(classes))]


def evaluate_by_node(run: Any, rule_classes: Iterable[type[Rule]], params: dict[str, dict[str, Any]] | None = None,
                     *, engine: Any, slice_us: int | None = None,
                     progress: Callable[[int], None] | None = None) -> list[RuleResult]:
    """The rules (each of which merges) fed one task per node on `engine`, merged here in the order of
    `feed.plan`. The caller holds the merged rules and one node's rules at a time."""
    classes = list(rule_classes)
    params = params or {}
    run = run.pinned()
    info = dict(run.info)
    info["operators"] = run.operators()
    slice_us = slice_us or slice_length(run)
    work: list[NodeWork] = [(node, [(a, b) for _, a, b in group])
                            for node, group in groupby(plan(run, slice_us), key=lambda p: p[0])]
    rules = make_rules(classes, params)
    failed: dict[int, RuleResult] = {}
    replay = RunReplay(run, info)
    # What the feed's first chunk shows every rule: every node, none with rows yet.
    prologue = empty_chunk(run, info, replay)
    prologue.final = False
    feed(rules, prologue, failed)
    task = partial(node_task, _shared(run.uri), uuid.uuid4().hex, [(cls, params.get(cls.name, {})) for cls in classes],
                   rule_metrics(classes), info)
    done = 0
    for (node, slices), (fed, errors) in zip(work, engine.map(task, work), strict=True):
        for i, rule in enumerate(rules):
            if i in failed:
                continue
            if i in errors:
                failed[i] = errors[i]
                continue
            try:
                rule.merge(fed[i], node)
            except Exception as exc:  # a rule that cannot merge this node reports it, never hides the others
                failed[i] = failed_result(rule, exc)
        done += len(slices)
        if progress is not None:
            progress(done)
    feed(rules, empty_chunk(run, info, replay), failed)
    if progress is not None:
        progress(done + 1)
    return results_of(rules, failed)


def node_task(uri: str, token: str, rules: list[tuple[type[Rule], dict[str, Any]]], metrics: set[str] | None,
              info: dict[str, Any], work: NodeWork) -> tuple[list[Rule | None], dict[int, RuleResult]]:
    """On a worker: fresh rules fed one node's slices of the run at `uri` (the last marked done), as the batch
    feed hands them; the rules (None for one that failed) and the failures, by index."""
    node, slices = work
    fresh = [cls(**p) for cls, p in rules]
    failed: dict[int, RuleResult] = {}
    for chunk in ahead_of(_node_chunks(worker_run(uri, token, node), node, slices, metrics, info), 1):
        feed(fresh, chunk, failed)
    return [None if i in failed else rule for i, rule in enumerate(fresh)], failed


def _node_chunks(run: Any, node: str, slices: list[tuple[int, int]], metrics: set[str] | None,
                 info: dict[str, Any]) -> Iterator[Chunk]:
    """The batch feed's chunks of one node (the last marked done), decoded on the read-ahead thread as
    `iter_run`'s are, so a worker reads the next slice while its rules work on this one."""
    replay = RunReplay(run, info)
    for k, (a, b) in enumerate(slices):
        run, system, events = read_slice(run, node, a, b, metrics, info.get("nodes", {}))
        chunk = Chunk(system, events, info, done=frozenset((node,)) if k == len(slices) - 1 else frozenset(),
                      replay=replay)
        framework_columns(chunk)
        yield chunk


def _shared(uri: str) -> str:
    from stallwatch.analyze.engine import shared_uri

    return shared_uri(uri)
