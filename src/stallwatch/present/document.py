"""The run document: one typed model of one run, what `stallwatch summary --json` prints and what the
dashboard's API answers (`/api/run/<id>/summary` its job part, `/api/run/<id>/document` all of it). Built from
the analysis's answers, serialized once by `to_json`; docs/format.md ("The run document") lists its fields."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from stallwatch import __version__
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.findings import Findings
from stallwatch.analyze.price import RunCost
from stallwatch.analyze.steps import StepStat
from stallwatch.analyze.summary import JobFate
from stallwatch.analyze.usage import UsageStat

SCHEMA = "stallwatch.summary/2"  # 2: `fate` (with `exit` kept as its old name), nodes as objects


@dataclass(frozen=True)
class NodeDoc:
    """A node as the document shows it: its record's state, size and ranks."""
    name: str
    status: str | None
    exit_code: int | None
    cores: int | None
    gpus: int
    ranks: list[str]
    sample_interval_ms: float | None
    end_us: int | None  # its end, or its newest data while it runs


@dataclass(frozen=True)
class RunDocument:
    """The job at a glance (always), then the sections a reader asked for (None: not asked, left out)."""
    run: str
    run_id: str
    command: list[str]
    start_us: int | None
    end_us: int | None
    last_us: int | None
    duration_s: float
    fate: JobFate
    nodes: list[NodeDoc]
    steps: dict[str, int]
    total_steps: int
    training_loop_s: float
    parts_s: dict[str, float] | None
    phase_shares: dict[str, dict[str, float]]
    notes: list[str] = field(default_factory=list)
    usage: dict[str, list[UsageStat]] | None = None
    step_stats: list[StepStat] | None = None
    findings: Findings | None = None
    cost: RunCost | None = None
    progress: dict[str, list[Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object; `exit` is `fate` under its old name (the summary's before schema 2), kept one release."""
        fate = self.fate.to_json()
        doc: dict[str, Any] = {
            "schema": SCHEMA, "stallwatch_version": __version__, "run": self.run, "run_id": self.run_id,
            "command": list(self.command), "start_us": self.start_us, "end_us": self.end_us, "last_us": self.last_us,
            "duration_s": self.duration_s, "fate": fate, "exit": dict(fate), "nodes": [asdict(n) for n in self.nodes],
            "steps": dict(self.steps), "total_steps": self.total_steps, "training_loop_s": self.training_loop_s,
            "parts_s": self.parts_s, "phase_shares": self.phase_shares, "notes": list(self.notes)}
        if self.usage is not None:
            doc["usage"] = {n: [asdict(u) for u in stats] for n, stats in self.usage.items()}
        if self.step_stats is not None:
            doc["step_stats"] = [asdict(s) for s in self.step_stats]
        if self.findings is not None:
            doc["findings"] = self.findings.to_json()
            doc["cost"] = self.cost.to_json() if self.cost is not None else None
        if self.progress is not None:
            doc["progress"] = self.progress
        return doc


FULL = ("usage", "step_stats", "findings")  # what `summary --json` carries beyond the job part


def run_document(analysis: RunAnalysis, node: str | None = None, *, sections: tuple[str, ...] = FULL) -> RunDocument:
    """The document of the analysed run (`node`: its usage and steps only); `sections` from FULL and
    "progress" (the dashboard's training-progress line)."""
    s = analysis.summary
    nodes = []
    for name in analysis.nodes:
        rec = analysis.node_record(name)
        nodes.append(NodeDoc(name, rec.status, rec.exit_code, rec.cpu_cores_logical, len(rec.gpus),
                             list(analysis.ranks.get(name, [])), s.sample_interval_ms.get(name), rec.last_us))
    shown = [node] if node else analysis.nodes
    return RunDocument(
        run=s.uri, run_id=s.run_id, command=list(s.command), start_us=s.start_us, end_us=s.end_us,
        last_us=s.last_us, duration_s=s.duration_s, fate=s.fate, nodes=nodes, steps=dict(s.steps),
        total_steps=s.total_steps, training_loop_s=s.loop_s, parts_s=s.parts_s(),
        phase_shares=analysis.phase_shares, notes=list(s.notes),
        usage={n: analysis.usage(n) for n in shown} if "usage" in sections else None,
        step_stats=analysis.step_stats(node) if "step_stats" in sections else None,
        findings=analysis.findings if "findings" in sections else None,
        cost=analysis.cost if "findings" in sections else None,
        progress=analysis.progress() if "progress" in sections else None)
