"""The dashboard's JSON documents: what `RunAnalysis` returns, as plain JSON for the page (numbers rounded for
size, NaN as null). Nothing is computed here beyond picking, rounding and shaping."""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Any, Sequence

import numpy as np

from stallwatch import __version__
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.catalog import RunRow
from stallwatch.analyze.compare import Comparison
from stallwatch.analyze.live_view import LiveFigures, overview
from stallwatch.analyze.memory import LABELS as MEMORY_LABELS
from stallwatch.analyze.memory_window import MemoryWindow
from stallwatch.analyze.node_series import NodeSeries
from stallwatch.analyze.python_profiles import WindowFunctions
from stallwatch.analyze.rank_tracks import RankTracks
from stallwatch.analyze.step_window import EventsWindow, StepBreakdown
from stallwatch.analyze.summary import RUNNING
from stallwatch.config import LIVE_FIELDS, SAMPLE_INTERVAL_PRESETS_MS, ProfilerConfig, ProfilingRange
from stallwatch.present.document import run_document
from stallwatch.store.node_record import NodeRecord
from stallwatch.store.stacks import StackDump
from stallwatch.timeutil import now_us as now

SCHEMA = 1
TOP_OPERATORS = 15


def header(kind: str) -> dict[str, Any]:
    return {"schema": f"stallwatch.dashboard.{kind}/{SCHEMA}", "stallwatch_version": __version__}


def compare_doc(baseline: str, run: str, comparison: Comparison) -> dict[str, Any]:
    """Two served runs compared (`stallwatch compare`'s content), by the ids the page opens them with."""
    return {**comparison.to_json(), **header("compare"), "baseline_id": baseline, "run_id": run,
            "p50_change_pct": comparison.slower_pct()}


def runs_doc(root: str, rows: Sequence[RunRow]) -> dict[str, Any]:
    return {**header("runs"), "root": root, "runs": [r.to_json() for r in rows]}


def summary_doc(run_id: str, a: RunAnalysis, live: LiveFigures | None = None,
                now_us: int | None = None) -> dict[str, Any]:
    """The job part of the run document (`present/document.py`, as `stallwatch summary --json` prints it) with
    the training progress line — the stored figures brought up to date with the nodes' live counts while the job
    runs (`live_view.overview`); `id` is the name this dashboard serves the run under."""
    s = a.summary
    doc = run_document(a, sections=("progress",))
    o = overview(running=s.fate.state == RUNNING, start_us=s.start_us, now_us=now_us or now(),
                 stored_steps=s.steps, stored_last_us=s.last_us, stored_duration_s=s.duration_s,
                 stored_ranks={n: list(a.ranks.get(n, [])) for n in a.nodes},
                 stored_loop=(s.loop.first_us, s.loop.last_us) if s.loop is not None else None,
                 stored_parts=s.parts_s(), stored_progress=doc.progress, stored_shares=a.phase_shares,
                 stored_latest=a.latest_step, live=live)
    doc = replace(doc, nodes=[replace(n, ranks=o.ranks.get(n.name, [])) for n in doc.nodes], steps=o.steps,
                  total_steps=o.total_steps, last_us=o.last_us, duration_s=o.duration_s, training_loop_s=o.loop_s,
                  parts_s=o.parts_s, phase_shares=o.phase_shares, progress=o.progress)
    return {**doc.to_json(), "id": run_id, "latest_step": o.latest_step, "live_us": o.live_us,
            "steps_per_s": live.steps_per_s if live is not None else None}


def full_doc(run_id: str, a: RunAnalysis) -> dict[str, Any]:
    """The whole run document: what `stallwatch summary --json` prints for the run."""
    return run_document(a).to_json()


def findings_doc(a: RunAnalysis) -> dict[str, Any]:
    """Every finding (ranked) and every rule's result, fired or not or not applicable."""
    f = a.findings.to_json()
    rules = []
    for r in a.rule_results:
        j = r.to_json()
        rules.append({"name": r.name, "status": _text(j.get("Status")), "triggered": bool(j.get("RuleTriggered")),
                      "violations": j.get("Violations"), "datapoints": j.get("Datapoints"),
                      "description": _text(j.get("Description")), "recommendation": _text(j.get("Recommendation")),
                      "message": _text(j.get("Message")), "parameters": j.get("Parameters") or {},
                      "details": j.get("Details") or {}})
    return {**header("findings"), **f, "rules": rules, "spans": [asdict(x) for x in a.flagged_spans[:500]]}


def usage_doc(a: RunAnalysis, nodes: dict[str, list[Any]]) -> dict[str, Any]:
    """The resource utilization table per node, and all nodes together (mean of means, highest max)."""
    mean, peak = a.usage_over_nodes
    return {**header("usage"), "percentiles_of": _bucket_means(a) if a.overview_from_rollups else "snapshots",
            "nodes": {n: [asdict(u) for u in stats] for n, stats in nodes.items()},
            "all": [{"label": k, "mean": mean[k], "max": peak.get(k)} for k in mean]}


def _bucket_means(a: RunAnalysis) -> str:
    """What the percentiles were taken of: the rollup buckets' means (the longest node's, when nodes differ)."""
    level = max((a.usage_level_us(n) for n in a.nodes), default=10_000_000) // 1_000_000
    return f"{level} s means" if level < 60 else f"{level // 60} min means"


def operators_doc(a: RunAnalysis) -> dict[str, Any]:
    ops = sorted(a.operators_per_step.items(), key=lambda kv: -kv[1])
    return {**header("operators"), "windows": len(a.profiles("detailed")),
            "operators": [{"name": k, "self_us_per_step": v} for k, v in ops[:TOP_OPERATORS]]}


def timeline_doc(ns: NodeSeries, record: NodeRecord, last_sample_us: int | None) -> dict[str, Any]:
    return {**header("timeline"), "node": ns.node, "from": ns.start_us, "to": ns.end_us, "bucket_us": ns.bucket_us,
            "full_resolution": ns.full_resolution, "snapshots": ns.snapshots, "ts": ns.ts.tolist(),
            "cores": ns.cores, "gpus": ns.gpus, "last_sample_us": last_sample_us,
            "status": record.status,
            "series": {k: {"min": _arr(b.min), "max": _arr(b.max), "mean": _arr(b.mean)} for k, b in ns.series.items()}}


def events_doc(node: str, w: EventsWindow) -> dict[str, Any]:
    return {**header("events"), "node": node, "from": w.start_us, "to": w.end_us, "steps": w.steps,
            "totals": [asdict(t) for t in w.totals], "truncated": w.truncated, "total_events": w.total_events,
            "events": [asdict(e) for e in w.events], "buckets": [asdict(b) for b in w.buckets]}


def tracks_doc(t: RankTracks) -> dict[str, Any]:
    """Per rank its phase blocks ([kind, start, end, step, mode] rows, compact), or per bucket each phase's share."""
    doc = {**header("tracks"), "node": t.node, "from": t.start_us, "to": t.end_us, "ranks": t.ranks,
           "aggregated": t.aggregated, "total_blocks": t.total_blocks, "zoom_in": t.zoom_in}
    if t.aggregated:
        return {**doc, "bucket_us": t.bucket_us, "bucket_start_us": t.bucket_start_us,
                "shares": {str(r): v for r, v in t.shares.items()}}
    blocks: dict[str, list[list[Any]]] = {str(r): [] for r in t.ranks}
    for b in t.blocks:
        blocks[str(b.rank)].append([b.kind, b.start_us, b.end_us, b.step, b.mode])
    return {**doc, "blocks": blocks}


def memory_doc(node: str, w: MemoryWindow) -> dict[str, Any]:
    """Per rank and field (rss_kb, cuda_*_kb) the memory its steps recorded (MiB), on one time grid `ts`."""
    return {**header("memory"), "node": node, "ts": w.ts,
            "series": [{"rank": m.rank, "field": m.field, "label": MEMORY_LABELS.get(m.field, m.field), "mb": m.mb}
                       for m in w.series]}


def stacks_doc(dumps: list[StackDump]) -> dict[str, Any]:
    """The newest stack dump of each rank's processes: untrusted text, bounded by the store, escaped by the page."""
    return {**header("stacks"), "dumps": [{k: v for k, v in d.to_json().items() if k != "path"} for d in dumps]}


def steps_doc(node: str, steps: list[StepBreakdown]) -> dict[str, Any]:
    return {**header("steps"), "node": node, "steps": [asdict(s) for s in steps]}


def ranks_doc(a: RunAnalysis, mode: str) -> dict[str, Any]:
    rs = a.rank_steps(mode)
    straggler = [f.to_json() for f in a.findings.findings if f.rule in ("Straggler", "CommunicationBound")]
    parts = [{"rank": f"{p.node}/{p.rank}", "steps": p.steps, "mean_ms": round(p.mean_ms, 3),
              "p50_ms": round(p.p50_ms, 3), "p95_ms": round(p.p95_ms, 3),
              "parts_ms": {k: round(v, 3) for k, v in p.parts_ms.items()},
              "communication_from": p.communication_from} for p in a.rank_parts(mode)]
    if rs is None:
        return {**header("ranks"), "mode": mode, "ranks": [], "straggler": straggler, "parts": parts}
    return {**header("ranks"), "mode": mode, "parts": parts, "ranks": rs.ranks, "first_step": rs.first_step,
            "steps_per_column": rs.steps_per_column, "ranks_total": rs.ranks_total,
            "step_ms": [_arr(row) for row in rs.step_ms],
            "wait_pct": None if rs.wait_pct is None else [_arr(row) for row in rs.wait_pct], "straggler": straggler}


def heatmap_doc(node: str, rows: Any) -> dict[str, Any]:
    if rows is None:
        return {**header("heatmap"), "node": node, "names": []}
    return {**header("heatmap"), "node": node, "names": rows.names, "start_us": rows.start_us,
            "width_us": rows.width_us, "values": [_arr(v, 0) for v in rows.values]}


def profiling_doc(config: ProfilerConfig, requests: list[dict[str, Any]], windows: list[dict[str, Any]]) -> dict[str, Any]:
    live = {}
    for name in LIVE_FIELDS:
        v = getattr(config, name)
        live[name] = v.to_spec() if isinstance(v, ProfilingRange) else v
    return {**header("profiling"), "live": live, "sample_interval_ms": config.sample_interval_ms,
            "sample_interval_presets_ms": list(SAMPLE_INTERVAL_PRESETS_MS), "requests": requests,
            "captures": [capture(w) for w in windows]}


def functions_doc(windows: list[WindowFunctions]) -> dict[str, Any]:
    """Each Python-profiling window's most expensive functions by own time, from the summary stored with it (the
    report's list): untrusted text, escaped by the page."""
    return {**header("functions"), "windows": [
        {"node": w.node, "rank": w.rank, "window": w.window, "profiler": w.profiler, "start_us": w.start_us,
         "first_step": w.first_step, "last_step": w.last_step, "total": w.total, "error": w.summary_error,
         "functions": [asdict(f) for f in w.top]} for w in windows]}


def capture(window: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of a capture window: where, when, and its stored files (to download)."""
    return {k: window.get(k) for k in ("node", "rank", "window", "layer", "start_us", "end_us", "first_step",
                                        "last_step", "stored")}


def _arr(values: np.ndarray, digits: int = 2) -> list[float | None]:
    rounded = np.round(np.asarray(values, dtype=np.float64), digits)
    return [None if not math.isfinite(v) else v for v in rounded.tolist()]


def _num(value: Any) -> int | float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
