"""Two runs side by side — a baseline and a run after a change: step-time distributions per mode, where a step's
time went, utilization, findings that appeared or went away, and per-operator time where both runs have
detailed windows. Runs of different lengths, nodes or ranks compare by distribution and share, never by sum;
what differs in shape is said."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze.steps import PHASES
from stallwatch.records import MODES, TRAIN

QUANTILES = (0.5, 0.9, 0.99)
USAGE_LABELS = ("CPU total", "Job CPU", "GPU", "Memory", "GPU memory", "I/O wait")
TOP_OPERATORS = 15


@dataclass(frozen=True)
class StepTimes:
    """One mode's step durations in ms: count, mean and quantiles (`QUANTILES`)."""
    mode: str
    steps: int
    mean_ms: float
    quantiles_ms: dict[float, float]

    def at(self, q: float) -> float:
        if q not in self.quantiles_ms:
            raise ValueError(f"quantile {q} not computed; one of {QUANTILES}")
        return self.quantiles_ms[q]


@dataclass(frozen=True)
class Pair:
    """A figure in the baseline and in the run (None where a run lacks it)."""
    name: str
    baseline: float | None
    run: float | None

    @property
    def change_pct(self) -> float | None:
        if self.baseline is None or self.run is None or self.baseline == 0:
            return None
        return 100.0 * (self.run - self.baseline) / self.baseline


@dataclass(frozen=True)
class RunFigures:
    """What a comparison reads of one run, gathered by its analysis (`RunAnalysis.comparison_figures`), so that
    comparing is a function of two runs' figures and knows nothing of how they were read."""
    uri: str
    step_times: dict[str, StepTimes]  # per mode (`step_times`)
    phase_shares: dict[str, dict[str, float]]  # per mode, phase: % of step time (`phase_shares`)
    utilization: dict[str, float]  # label: mean over nodes of each node's mean, %
    findings: dict[str, str]  # rule: the finding's title
    operators_us: dict[str, float]  # `name [device]`: self time per profiled step, µs (`operators_per_step`)
    nodes: int
    ranks: int


@dataclass(frozen=True)
class Comparison:
    baseline_uri: str
    run_uri: str
    step_times: dict[str, tuple[StepTimes | None, StepTimes | None]]  # per mode
    phases: dict[str, list[Pair]]  # per mode: each phase's share of step time, %
    utilization: list[Pair]  # mean over nodes of each node's mean, %
    findings_appeared: list[str]
    findings_gone: list[str]
    findings_kept: list[str]
    operators: list[Pair]  # self time per profiled step, µs
    notes: list[str] = field(default_factory=list)

    def slower_pct(self, mode: str = TRAIN, quantile: float = 0.5) -> float | None:
        """How much slower (positive) or faster the run's steps of `mode` are at `quantile`, in %."""
        base, run = self.step_times.get(mode, (None, None))
        if base is None or run is None or base.at(quantile) <= 0:
            return None
        return 100.0 * (run.at(quantile) - base.at(quantile)) / base.at(quantile)

    def to_json(self) -> dict[str, Any]:
        def times(t: StepTimes | None) -> dict[str, Any] | None:
            return None if t is None else {"steps": t.steps, "mean_ms": t.mean_ms,
                                           **{f"p{round(q * 100)}_ms": v for q, v in t.quantiles_ms.items()}}

        def pairs(ps: list[Pair]) -> list[dict[str, Any]]:
            return [{"name": p.name, "baseline": p.baseline, "run": p.run, "change_pct": p.change_pct} for p in ps]

        return {"schema": "stallwatch.compare/1", "baseline": self.baseline_uri, "run": self.run_uri,
                "step_times": {m: {"baseline": times(b), "run": times(r), "p50_change_pct": self.slower_pct(m, 0.5)}
                               for m, (b, r) in self.step_times.items()},
                "phases": {m: pairs(ps) for m, ps in self.phases.items()}, "utilization": pairs(self.utilization),
                "findings": {"appeared": self.findings_appeared, "gone": self.findings_gone,
                             "kept": self.findings_kept},
                "operators_us_per_step": pairs(self.operators), "notes": self.notes}


def step_times(table: pa.Table) -> dict[str, StepTimes]:
    """Per mode, all ranks together, of the step events `table` (mode, start_us, end_us)."""
    out = {}
    if not table.num_rows:
        return out
    modes = table["mode"].cast(pa.string())
    for mode in MODES:
        rows = table.filter(pc.equal(modes, mode))
        if not rows.num_rows:
            continue
        ms = (rows["end_us"].to_numpy().astype(np.float64) - rows["start_us"].to_numpy()) / 1e3
        out[mode] = StepTimes(mode, len(ms), float(ms.mean()),
                              {q: float(np.quantile(ms, q)) for q in QUANTILES})
    return out


def phase_shares(steps: pa.Table, events: pa.Table) -> dict[str, dict[str, float]]:
    """Per mode, each phase's share of the mode's step time, % (phases of steps only), of the step events and
    the phase events (`PHASES`: kind, mode, step, start_us, end_us)."""
    out: dict[str, dict[str, float]] = {}
    if not steps.num_rows:
        return out
    step_modes = steps["mode"].cast(pa.string())
    ev_modes = events["mode"].cast(pa.string()) if events.num_rows else None
    for mode in MODES:
        rows = steps.filter(pc.equal(step_modes, mode))
        total = float(pc.sum(pc.subtract(rows["end_us"], rows["start_us"])).as_py() or 0)
        if total <= 0:
            continue
        shares = {}
        if ev_modes is not None:
            mine = events.filter(pc.and_(pc.equal(ev_modes, mode), pc.is_valid(events["step"])))
            kinds = mine["kind"].cast(pa.string())
            for phase in PHASES:
                of = mine.filter(pc.equal(kinds, phase))
                spent = float(pc.sum(pc.subtract(of["end_us"], of["start_us"])).as_py() or 0) if of.num_rows else 0.0
                shares[phase] = 100.0 * spent / total
        out[mode] = shares
    return out


def utilization(means: dict[str, float]) -> dict[str, float]:
    """Of the mean over nodes of each node's mean utilization, %, the labels of `USAGE_LABELS` a run has."""
    return {label: v for label, v in means.items() if label in USAGE_LABELS}


def operators_per_step(ops: pa.Table, windows: list[dict[str, Any]]) -> dict[str, float]:
    """Self time per profiled step of each operator (`name [device]`), µs, over the detailed windows (`ops`:
    their per-operator totals; `windows`: their window.json records)."""
    steps = sum(max(int(w.get("last_step", 0)) - int(w.get("first_step", 0)) + 1, 1)
                for w in windows if isinstance(w.get("first_step"), int)
                and isinstance(w.get("last_step"), int))
    if not ops.num_rows or steps <= 0:
        return {}
    totals: dict[str, float] = {}
    for row in ops.select(["operator", "device", "self_us"]).to_pylist():
        key = f"{row['operator']} [{row['device']}]"
        totals[key] = totals.get(key, 0.0) + float(row["self_us"] or 0)
    return {k: v / steps for k, v in totals.items()}


def compare(baseline: RunFigures, run: RunFigures) -> Comparison:
    b_times, r_times = baseline.step_times, run.step_times
    modes = [m for m in MODES if m in b_times or m in r_times]
    b_ph, r_ph = baseline.phase_shares, run.phase_shares
    phases = {m: [Pair(p, b_ph.get(m, {}).get(p), r_ph.get(m, {}).get(p)) for p in PHASES]
              for m in modes if m in b_ph or m in r_ph}
    b_u, r_u = baseline.utilization, run.utilization
    usage = [Pair(label, b_u.get(label), r_u.get(label)) for label in USAGE_LABELS if label in b_u or label in r_u]
    b_f, r_f = baseline.findings, run.findings
    b_ops, r_ops = baseline.operators_us, run.operators_us
    operators = []
    if b_ops and r_ops:
        keys = sorted(set(b_ops) | set(r_ops), key=lambda k: -max(b_ops.get(k, 0.0), r_ops.get(k, 0.0)))
        operators = [Pair(k, b_ops.get(k), r_ops.get(k)) for k in keys[:TOP_OPERATORS]]
    return Comparison(baseline.uri, run.uri, {m: (b_times.get(m), r_times.get(m)) for m in modes}, phases,
                      usage, [r_f[k] for k in sorted(set(r_f) - set(b_f))],
                      [b_f[k] for k in sorted(set(b_f) - set(r_f))], [r_f[k] for k in sorted(set(r_f) & set(b_f))],
                      operators, _shape_notes(baseline, run, b_times, r_times, bool(b_ops), bool(r_ops)))


def _shape_notes(baseline: RunFigures, run: RunFigures, b_times: dict[str, StepTimes],
                 r_times: dict[str, StepTimes], b_ops: bool, r_ops: bool) -> list[str]:
    """What differs in the runs' shape, so a reader weighs the comparison."""
    notes = []
    for mode in sorted(set(b_times) | set(r_times)):
        b, r = b_times.get(mode), r_times.get(mode)
        if b is None or r is None:
            notes.append(f"only the {'run' if b is None else 'baseline'} has {mode} steps")
        elif b.steps != r.steps:
            notes.append(f"{mode} steps differ ({b.steps:,} in the baseline, {r.steps:,} in the run): "
                         "distributions are compared, not totals")
    if baseline.nodes != run.nodes:
        notes.append(f"nodes differ ({baseline.nodes} in the baseline, {run.nodes} in the run)")
    if baseline.ranks != run.ranks:
        notes.append(f"ranks differ ({baseline.ranks} in the baseline, {run.ranks} in the run)")
    if b_ops != r_ops:
        notes.append(f"only the {'run' if r_ops else 'baseline'} has detailed-profiling windows: no operator "
                     "comparison")
    return notes
