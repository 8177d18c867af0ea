"""What the dashboard's JSON API returns, built from a RunAnalysis only: the page renders these documents,
it computes nothing itself."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.series import Panel, Span
from stallwatch.present import json_out
from stallwatch.records import TRAIN


def overview(analysis: RunAnalysis) -> dict[str, Any]:
    """The job summary, utilization per node, steps per rank, every rule (fired or not) and the findings."""
    doc = json_out.summary_json(analysis)
    doc["rules"] = [r.to_json() for r in analysis.rule_results]
    doc["notes"] = analysis.notes
    doc["sample_interval_ms"] = analysis.sample_interval_ms
    doc["node_status"] = {n: _node_status(analysis.node_info(n)) for n in analysis.nodes}
    doc["operators"] = _top_operators(analysis)
    return doc


def nodes(analysis: RunAnalysis, node: str, start_us: int | None = None, end_us: int | None = None) -> dict[str, Any]:
    """One node's system metrics over time (min/max-downsampled by the analysis; over [start_us, end_us) only
    when given, at full resolution for a short range), the training phases and the spans the rules flagged."""
    panels = (analysis.timeline_window(node, start_us, end_us) if start_us is not None and end_us is not None
              else analysis.timeline_panels([node]))
    return {"node": node, "panels": [_panel(p) for p in panels], "range": [start_us, end_us],
            "phases": [_span(s) for s in analysis.phase_spans],
            "flagged": [_span(s) for s in analysis.flagged_spans],
            "last_sample_us": (analysis.info.get("nodes") or {}).get(node, {}).get("end_us_from_data")}


def ranks(analysis: RunAnalysis, mode: str = TRAIN) -> dict[str, Any]:
    """Rank × step heatmaps of step time and of data wait, and the Straggler rule's verdict."""
    rs = analysis.rank_steps(mode)
    straggler = analysis.rule("Straggler")
    doc: dict[str, Any] = {"mode": mode, "straggler": straggler.to_json() if straggler else None}
    if rs is None:
        return {**doc, "ranks": []}
    return {**doc, "ranks": rs.ranks, "first_step": rs.first_step, "steps_per_column": rs.steps_per_column,
            "step_ms": _matrix(rs.step_ms), "wait_pct": None if rs.wait_pct is None else _matrix(rs.wait_pct)}


def _node_status(record: dict[str, Any]) -> dict[str, Any]:
    return {"status": record.get("status"), "exit_code": record.get("exit_code"),
            "last_us": record.get("end_us_from_data") or record.get("end_us")}


def _top_operators(analysis: RunAnalysis) -> dict[str, Any]:
    """The detailed windows' most expensive CPU and GPU operators, as OverallFrameworkMetrics ranked them."""
    result = analysis.rule("OverallFrameworkMetrics")
    tables = (result.details.get("operators") if result is not None else None) or {}
    return {label: list(tables.get(label) or []) for label in ("CPU", "GPU")}


def _panel(p: Panel) -> dict[str, Any]:
    return {"title": p.title, "y_label": p.y_label, "percent": p.percent,
            "series": [{"name": s.name, "ts": _ints(s.ts), "values": _floats(s.values)} for s in p.series]}


def _span(s: Span) -> dict[str, Any]:
    return asdict(s)


def _ints(a: np.ndarray) -> list[int]:
    return np.asarray(a, dtype=np.int64).tolist()


def _floats(a: np.ndarray) -> list[float | None]:
    v = np.asarray(a, dtype=np.float64)
    return [None if not np.isfinite(x) else round(float(x), 3) for x in v]


def _matrix(m: np.ndarray) -> list[list[float | None]]:
    return [_floats(row) for row in np.asarray(m, dtype=np.float64)]
