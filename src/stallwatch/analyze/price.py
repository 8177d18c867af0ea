"""The run as money: a price per node-hour turns the job's duration into a cost — in total, per part of the job
(initialization, training loop, finalization) and the share spent waiting (idle GPUs, data wait, straggler
wait) — and what was measured into right-sizing advice, each piece with its evidence and estimated saving.
Estimates from utilization and time at stake, said as such; the price is the user's, in their currency."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stallwatch.analyze.findings import Findings
from stallwatch.analyze.summary import JobSummary

GPU_IDLE_BELOW = 30.0  # % mean GPU utilization under which GPUs are "idle most of the time"
GPU_TARGET = 70.0  # % a right-sized GPU job reaches: the GPU count that would do the work at this level
MEMORY_HEADROOM_BELOW = 40.0  # % peak memory under which a smaller-memory machine would do
CPU_BOUND_ABOVE = 70.0  # % mean CPU for an input pipeline to be called CPU-bound


@dataclass(frozen=True)
class Advice:
    title: str
    evidence: str
    saving: float | None  # per run, in the price's currency; None where it depends on a price list
    saving_pct: float | None

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "evidence": self.evidence, "saving": _r(self.saving),
                "saving_pct": _r(self.saving_pct)}


@dataclass(frozen=True)
class RunCost:
    price_per_hour: float
    nodes: int
    hours: float  # the job's duration
    total: float
    parts: dict[str, float]  # Initialization / Training loop / Finalization
    waiting: dict[str, float]  # idle GPUs / data wait / straggler wait: what that time cost
    advice: list[Advice] = field(default_factory=list)

    @property
    def waiting_total(self) -> float:
        return sum(self.waiting.values())

    def to_json(self) -> dict[str, Any]:
        return {"price_per_hour": self.price_per_hour, "nodes": self.nodes, "hours": _r(self.hours),
                "total": _r(self.total), "parts": {k: _r(v) for k, v in self.parts.items()},
                "waiting": {k: _r(v) for k, v in self.waiting.items()}, "advice": [a.to_json() for a in self.advice]}

    def line(self) -> str:
        """The terminal's one line."""
        waiting = (f", of which {money(self.waiting_total)} waiting ("
                   + ", ".join(f"{k} {money(v)}" for k, v in self.waiting.items() if v > 0) + ")"
                   if self.waiting_total > 0 else "")
        return (f"{money(self.total)} for {self.nodes} node{'s' if self.nodes != 1 else ''} × "
                f"{self.hours:.2f} h at {money(self.price_per_hour)} per node-hour{waiting}")


def money(value: float) -> str:
    return f"{value:,.2f}" if value >= 0.01 or value == 0 else f"{value:.4f}"


def run_cost(price_per_hour: float, summary: JobSummary, findings: Findings, *, usage_mean: dict[str, float],
             usage_max: dict[str, float], data_wait_pct: float | None) -> RunCost:
    """`usage_mean` / `usage_max`: utilization labels (GPU, CPU total, Memory…) over nodes, %;
    `data_wait_pct`: the TRAIN steps' share spent waiting for data."""
    nodes = max(len(summary.nodes), 1)
    hours = summary.duration_s / 3600
    total = price_per_hour * nodes * hours
    per_s = total / summary.duration_s if summary.duration_s > 0 else 0.0
    parts = {k: v * per_s for k, v in (summary.parts_s() or {}).items()}
    loop_cost = parts.get("Training loop", total)
    waiting: dict[str, float] = {}
    gpu = usage_mean.get("GPU")
    if gpu is not None:
        waiting["idle GPUs"] = total * max(0.0, 100.0 - gpu) / 100.0
    if data_wait_pct:
        waiting["data wait"] = loop_cost * data_wait_pct / 100.0
    straggler = next((f for f in findings.findings if f.rule == "Straggler"), None)
    if straggler is not None and straggler.time_at_stake_s and summary.loop_s > 0:
        waiting["straggler wait"] = loop_cost * min(straggler.time_at_stake_s / summary.loop_s, 1.0)
    comm = next((f for f in findings.findings if f.rule == "CommunicationBound"), None)
    if comm is not None and comm.time_at_stake_s and summary.loop_s > 0:
        waiting["communication wait"] = loop_cost * min(comm.time_at_stake_s / summary.loop_s, 1.0)
    return RunCost(price_per_hour, nodes, hours, total, parts, waiting,
                   _advice(total, findings, usage_mean, usage_max, data_wait_pct))


def _advice(total: float, findings: Findings, usage_mean: dict[str, float], usage_max: dict[str, float],
            data_wait_pct: float | None) -> list[Advice]:
    out = []
    gpu = usage_mean.get("GPU")
    if gpu is not None and gpu < GPU_IDLE_BELOW:
        keep = max(gpu / GPU_TARGET, 0.0)
        pct = 100.0 * (1.0 - keep)
        out.append(Advice("GPUs idle most of the time: use fewer or smaller GPUs (or feed them faster)",
                          f"mean GPU utilization {gpu:.0f} %; the same work at {GPU_TARGET:.0f} % needs about "
                          f"{100 * keep:.0f} % of the GPU capacity", total * pct / 100.0, pct))
    starved = any(f.rule == "InputBound" for f in findings.findings)
    cpu = usage_mean.get("CPU total")
    if starved and data_wait_pct:
        bound = cpu is not None and cpu >= CPU_BOUND_ABOVE
        title = ("CPU-bound input pipeline: more vCPUs per GPU (or fewer GPUs per node)" if bound else
                 "Input-bound: fix the data pipeline before paying for more accelerators")
        evidence = (f"training steps wait for data {data_wait_pct:.0f} % of the time"
                    + (f"; CPU {cpu:.0f} % busy on average" if cpu is not None else ""))
        out.append(Advice(title, evidence, total * data_wait_pct / 100.0, data_wait_pct))
    memory = usage_max.get("Memory")
    if memory is not None and memory < MEMORY_HEADROOM_BELOW:
        out.append(Advice("Memory headroom: an instance type with less memory would do",
                          f"peak memory {memory:.0f} % of the machine's", None, None))
    return out


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)
