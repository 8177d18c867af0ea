"""A folder of runs at a glance, from their records alone (no samples or events read): each run's id, status
(running, or how it ended), start, duration, nodes, steps and top finding, newest first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stallwatch.analyze.finding import SEVERITIES
from stallwatch.analyze.summary import job_fate
from stallwatch.store.catalog import RunRecords


@dataclass(frozen=True)
class RunRow:
    id: str  # the handle that opens it: its folder's name (what `info`, `report`, `#run=` take)
    uri: str
    status: str  # running | succeeded | failed | killed | interrupted | stopped | unknown
    exit_code: int | None
    signal: str | None
    start_us: int | None
    duration_s: float | None
    nodes: list[str]
    steps: dict[str, int] | None  # None when the run has no findings.json yet (still running, or older)
    top_finding: str | None
    verdict: str | None
    run_id: str = ""  # the id its run.json records: another than `id` for a run copied or moved
    top_severity: str | None = None  # the top finding's (high | medium | low; anything else read as None)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "run_id": self.run_id, "uri": self.uri, "status": self.status,
                "exit_code": self.exit_code,
                "signal": self.signal, "start_us": self.start_us, "duration_s": self.duration_s,
                "nodes": self.nodes, "steps": self.steps, "top_finding": self.top_finding, "verdict": self.verdict,
                "top_severity": self.top_severity}


def run_row(records: RunRecords) -> RunRow:
    nodes = records.nodes
    starts = [r.start_us for r in nodes.values() if r.start_us is not None]
    ends = [r.end_us for r in nodes.values() if r.end_us is not None]
    start = min(starts) if starts else _int(records.run.get("created_us"))
    fate = job_fate(nodes, (records.run.get("config") or {}).get("stop_training")
                    if isinstance(records.run.get("config"), dict) else None)
    done = bool(nodes) and len(ends) == len(nodes)
    f = records.findings or {}
    found = f.get("findings") if isinstance(f.get("findings"), list) else []
    top = found[0].get("title") if found and isinstance(found[0], dict) else None
    severity = found[0].get("severity") if found and isinstance(found[0], dict) else None
    steps = f.get("steps") if isinstance(f.get("steps"), dict) else None
    return RunRow(records.name, records.uri, fate.state, fate.code, fate.signal,
                  start, (max(ends) - start) / 1e6 if done and start is not None else None, sorted(nodes),
                  {str(k): int(v) for k, v in steps.items() if _int(v) is not None} if steps is not None else None,
                  str(top) if top else None, str(f["verdict"]) if isinstance(f.get("verdict"), str) else None,
                  str(records.run.get("run_id") or records.name),
                  severity if severity in SEVERITIES else None)


def run_rows(found: list[RunRecords]) -> list[RunRow]:
    """The runs, newest first."""
    rows = [run_row(r) for r in found]
    return sorted(rows, key=lambda r: (r.start_us or 0, r.id), reverse=True)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
