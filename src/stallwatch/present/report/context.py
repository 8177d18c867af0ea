"""Everything the report's sections read, gathered once per report: the run, its info, the rules' results
and cached reads of the store. Sections compute nothing from files themselves; they ask the context."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

import pyarrow as pa

from stallwatch.analyze.rules.base import NodeFrame
from stallwatch.analyze.rules.feed import iter_run, node_frame
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.analyze.rules.runner import RULES_DIR, evaluate
from stallwatch.records import COLUMN_SEP, STEP
from stallwatch.store.reader import Run


class ReportContext:
    """One run, read lazily and once. `rules` maps rule name to its result JSON (RULES.md's schema: the keys
    of `RuleResult.to_json`), in the built-in rules' order, then custom rules found in the run."""

    def __init__(self, run: Run, *, rule_results: dict[str, dict[str, Any]] | None = None) -> None:
        self.run = run
        self._given_rules = rule_results
        self._system: dict[str, tuple[frozenset[str] | None, NodeFrame]] = {}  # node -> (metrics read, frame)

    @cached_property
    def info(self) -> dict[str, Any]:
        return dict(self.run.info)

    @cached_property
    def nodes(self) -> list[str]:
        return list(self.run.nodes)

    def node_info(self, node: str) -> dict[str, Any]:
        """nodes/<node>.json: cores, memory, GPUs, start/end, status, sample interval."""
        return dict((self.info.get("nodes") or {}).get(node) or {})

    @cached_property
    def rules(self) -> dict[str, dict[str, Any]]:
        if self._given_rules is not None:
            return dict(self._given_rules)
        stored = self._stored_rules()
        names = [cls.name for cls in builtin_rules()]
        if stored is not None and all(n in stored for n in names):
            return stored
        results = evaluate(builtin_rules(), iter_run(self.run, builtin_rules()))
        return {r.name: r.to_json() for r in results}

    def _stored_rules(self) -> dict[str, dict[str, Any]] | None:
        """rules/*.json as the end of `stallwatch run` (or `stallwatch rules`) wrote them, when the run has
        finished (a running run's stored results may be stale: those are evaluated afresh)."""
        statuses = [n.get("status") for n in (self.info.get("nodes") or {}).values()]
        if not statuses or any(s == "running" for s in statuses):
            return None
        out: dict[str, dict[str, Any]] = {}
        names = [cls.name for cls in builtin_rules()]
        for entry in self.run.location.list(RULES_DIR):
            name = entry.path.rsplit("/", 1)[-1]
            if not name.endswith(".json"):
                continue
            try:
                record = json.loads(self.run.location.read(entry.path))
            except Exception:
                return None
            out[str(record.get("RuleName", name[:-5]))] = record
        ordered = {n: out[n] for n in names if n in out}
        ordered.update({n: v for n, v in sorted(out.items()) if n not in ordered})
        return ordered

    def system(self, node: str, metrics: tuple[str, ...] | None = None) -> NodeFrame:
        """One node's snapshots as a time-ordered NodeFrame (float32 columns `device/metric`), only the
        `metrics` asked for (all when None). Each node is read once for the union of what the sections ask:
        a later request for metrics already read is served from memory."""
        wanted = None if metrics is None else frozenset(metrics)
        have = self._system.get(node)
        if have is not None and (have[0] is None or (wanted is not None and wanted <= have[0])):
            return _subset(have[1], wanted)
        read = wanted if have is None or wanted is None or have[0] is None else wanted | have[0]
        frame = node_frame(node, self.run.system_wide(node, metrics=read), self.node_info(node))
        self._system[node] = (read, frame)
        return _subset(frame, wanted)

    @cached_property
    def steps(self) -> pa.Table:
        """The step events of the run (node, rank, kind, mode, step, start_us, end_us), ordered by node, rank
        and time: what the sections need of the framework data, read without decoding the other events'
        columns (a long multi-node run has tens of millions of events, a fifth of them steps)."""
        return self.run.framework(kinds={STEP}, fields=("kind", "mode", "step", "start_us", "end_us"))

    @cached_property
    def framework(self) -> pa.Table:
        """Every framework event of the run (`framework_schema()`), ordered by node, rank and time. Costly on
        long runs: sections use `steps` and the rules' results instead."""
        return self.run.framework()

    @cached_property
    def operators(self) -> pa.Table:
        """Per-operator totals of detailed-profiling windows (`operators_schema()`)."""
        return self.run.operators()


def _subset(frame: NodeFrame, metrics: frozenset[str] | None) -> NodeFrame:
    """The frame with only the columns of `metrics` (the same arrays, not copies)."""
    if metrics is None:
        return frame
    cols = {c: v for c, v in frame.columns.items() if c.partition(COLUMN_SEP)[2] in metrics}
    return NodeFrame(frame.node, frame.timestamps, cols, frame.info)
