"""The machine-readable documents of `--json` (`info`, `summary`, `rules`, `ls`): one JSON object on stdout,
nothing else there, so scripts and CI jobs read a run without scraping text. Each carries `"schema"` (its name
and version); docs/cli.md documents them."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any, Sequence

from stallwatch import __version__
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.catalog import RunRow
from stallwatch.analyze.results import RuleResult

SCHEMA_VERSION = 1


def dumps(document: dict[str, Any]) -> str:
    """JSON text of a document: numpy values as plain numbers, NaN and infinities as null."""
    return json.dumps(_plain(document), indent=2, allow_nan=False)


def _header(kind: str) -> dict[str, Any]:
    return {"schema": f"stallwatch.{kind}/{SCHEMA_VERSION}", "stallwatch_version": __version__}


def info_json(analysis: RunAnalysis) -> dict[str, Any]:
    """What a run holds: its nodes, ranks, span, size, metrics per node, steps, windows and how it ended."""
    run, s = analysis.run, analysis.summary
    overview = run.system_overview()
    files = run.files()
    nodes = []
    for name in analysis.nodes:
        rec = analysis.node_record(name)
        ov = overview.get(name)
        nodes.append({"name": name, "cores": rec.cpu_cores_logical, "gpus": len(rec.gpus),
                      "snapshots": ov.snapshots if ov else 0, "first_us": ov.start_us if ov else None,
                      "last_us": ov.end_us if ov else None, "stored_bytes": ov.bytes if ov else 0,
                      "unreadable_files": ov.unreadable if ov else 0, "status": rec.status,
                      "exit_code": rec.exit_code, "ranks": analysis.ranks.get(name, []),
                      "sample_interval_ms": s.sample_interval_ms.get(name),
                      "metrics": sorted(f"{k.device}/{k.metric}" for k in run.system_keys(name))})
    return {**_header("info"), "run": run.uri, "run_id": s.run_id, "command": s.command, "start_us": s.start_us,
            "end_us": s.end_us, "duration_s": s.duration_s, "size_bytes": sum(f.size for f in files),
            "files": len(files), "fate": s.fate.to_json(), "exit": s.fate.to_json(), "nodes": nodes, "steps": s.steps,
            "step_stats": [asdict(x) for x in analysis.step_stats()] if analysis.ranks else [],
            "profiling_windows": analysis.profiles(), "notes": s.notes,
            "recorded_custom_rules": analysis.recorded_custom_rules}


def summary_json(analysis: RunAnalysis, node: str | None = None) -> dict[str, Any]:
    """The end-of-run summary: the run document (`present/document.py`), as the dashboard's API serves it."""
    from stallwatch.present.document import run_document

    return run_document(analysis, node).to_json()


def compare_json(analysis: RunAnalysis) -> dict[str, Any]:
    """This run against its baseline (`stallwatch compare --json`)."""
    return {**_header("compare"), **analysis.comparison.to_json()} if analysis.comparison else _header("compare")


def rules_json(uri: str, results: Sequence[RuleResult]) -> dict[str, Any]:
    """Every rule's result in RULES.md's schema (as rules/<RuleName>.json holds it)."""
    return {**_header("rules"), "run": uri, "results": [r.to_json() for r in results]}


def runs_json(root: str, rows: Sequence[RunRow]) -> dict[str, Any]:
    return {**_header("runs"), "root": root, "runs": [r.to_json() for r in rows]}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
