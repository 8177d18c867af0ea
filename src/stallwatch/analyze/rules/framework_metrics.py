"""OverallFrameworkMetrics: where the training loop's time went (never fires)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np
import pyarrow as pa

from stallwatch.analyze.framework_frame import mode_order, new_events, rank_key, text_codes
from stallwatch.analyze.rules.base import Chunk, Rule, RuleResult
from stallwatch.analyze.rules.kit.details import DetailsRecord, json_key
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, EVAL, FORWARD, OPTIMIZER, STEP, UNTIMED

GENERAL = (DATA_WAIT, OPTIMIZER, COLLECTIVE)
PARTS = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE)  # a step's time, by what it was spent on
OTHER = "other"  # a step's time outside every part: the loop's own code (a closure's logging, a `loss.item()`)
INSTANT = ("dataloader", "profiling", "loop")  # markers, not time the loop spent
OTHERS = "others"
MAX_NAMES = 20  # event names listed per kind
MAX_OPERATORS = 50  # operators listed per device
DEVICES = {"cpu": "CPU", "cuda": "GPU"}
_OP_KEY = ("node", "rank", "window", "operator", "device")


@dataclass(frozen=True)
class EventTotal(DetailsRecord):
    """One event name of one kind, all ranks: how many and their time (µs)."""

    count: int = 0
    total_us: int = 0


@dataclass(frozen=True)
class ModeSteps(DetailsRecord):
    """One mode's timed steps: how many and their time (µs); per part of the step its time (µs) and share (%)."""

    steps: int = 0
    step_us: int = 0
    parts_us: dict[str, int] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RankMetrics(DetailsRecord):
    """One rank, Details["ranks"]["node/rank"]: its steps, time per phase (µs, % of its loop), stretches counted but
    not timed (µs per phase), forward/backward shares (%), general events (µs) and every event kind (µs)."""

    steps: int = 0
    phase: dict[str, float] = field(default_factory=dict)
    phase_us: dict[str, int] = field(default_factory=dict)
    untimed_us: dict[str, int] = field(default_factory=dict)
    forward_backward: dict[str, float] = field(default_factory=dict)
    general_us: dict[str, int] = field(default_factory=dict)
    events_us: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Operator(DetailsRecord):
    """One operator over the detailed-profiling windows: calls, self and total time (µs), % of its device's self
    time."""

    operator: str = ""
    calls: int = 0
    self_us: float = 0.0
    total_us: float = 0.0
    percent: float = 0.0


@dataclass(frozen=True)
class OperatorTables(DetailsRecord):
    """Details["operators"]: the most expensive CPU and GPU operators (MAX_OPERATORS each) and how many there were."""

    cpu: list[Operator] = json_key("CPU", [])
    gpu: list[Operator] = json_key("GPU", [])
    cpu_count: int | None = json_key("CPU_count")
    gpu_count: int | None = json_key("GPU_count")

    def of(self, label: str) -> tuple[list[Operator], int | None]:
        """("CPU" or "GPU") its operators and their count."""
        return (self.cpu, self.cpu_count) if label == "CPU" else (self.gpu, self.gpu_count)

    def __bool__(self) -> bool:
        return bool(self.cpu or self.gpu or self.cpu_count or self.gpu_count)


@dataclass(frozen=True)
class OverallFrameworkMetricsDetails(DetailsRecord):
    """OverallFrameworkMetrics' Details: the loop's time per phase (µs, % of it) and the stretches of sampled steps
    counted but not timed (µs), forward/backward (µs, %), general events (µs, %), per mode its steps' parts, every
    event by kind and name, per rank, and from detailed profiling the operator tables, their windows and the CPU/GPU
    ratio (% of operator time)."""

    rule = "OverallFrameworkMetrics"
    phase: dict[str, float] = field(default_factory=dict)
    phase_us: dict[str, int] = field(default_factory=dict)
    untimed_us: dict[str, int] = field(default_factory=dict)
    forward_backward: dict[str, float] = field(default_factory=dict)
    forward_backward_us: dict[str, int] = field(default_factory=dict)
    general: dict[str, float] = field(default_factory=dict)
    general_us: dict[str, int] = field(default_factory=dict)
    modes: dict[str, ModeSteps] = field(default_factory=dict)
    events: dict[str, dict[str, EventTotal]] = field(default_factory=dict)
    ranks: dict[str, RankMetrics] = field(default_factory=dict)
    operator_windows: int = 0
    operators: OperatorTables = field(default_factory=OperatorTables)
    ratio: dict[str, float] = field(default_factory=dict)


class OverallFrameworkMetrics(Rule):
    """Per rank and overall: the share of time in TRAIN / EVAL / GLOBAL steps and "others" (between steps:
    from the rank's first step's start to its last step's end, minus the steps; sampled steps' counted stretches
    are time in steps of their mode); forward vs backward; the
    general events (waiting for data, optimizer, collectives) with totals per event name; per mode, where its
    timed steps' time went (`modes`: each part's share of those steps' time, the rest "other", the loop's own
    code; forward vs backward is the training modes'); and, from the
    detailed-profiling windows, the CPU and GPU operator tables (name, % of the device's self time,
    cumulative µs) and the CPU/GPU ratio.

    It never fires. Everything it keeps is an integer sum per key, so any chunking gives the same result.
    Operator rows come from `chunk.run["operators"]` (a list of dicts, or `Run.operators()`'s table), rows
    node, rank, window, operator, device, calls, self_us, total_us; rows are de-duplicated by (node, rank,
    window, operator, device), so the feed may hand all rows so far or only new ones."""

    name = "OverallFrameworkMetrics"
    metrics = ()  # framework events only
    description = ("Summarizes where the training loop's time went: the share of time spent in TRAIN, EVAL and "
                   "GLOBAL steps and between steps, forward versus backward pass, data loading, optimizer and "
                   "collective operations, and the most expensive CPU and GPU operators from detailed profiling. "
                   "This rule never triggers.")
    recommendation = ("Check the phase that dominates: much time between steps (\"others\") points to work outside the "
                      "training loop (evaluation, checkpointing, logging), a large share of waiting for data to the "
                      "input pipeline, and the most expensive operators to where the model itself can be optimized.")
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._events = 0
        self._ranks: dict[tuple[str, int], dict[str, Any]] = {}
        self._names: dict[tuple[str, str], list[int]] = {}  # (kind, name) -> [count, µs]
        self._operators: dict[tuple, dict[str, Any]] = {}

    def _rank(self, key: tuple[str, int]) -> dict[str, Any]:
        if key not in self._ranks:
            self._ranks[key] = {"first": None, "last": None, "steps": 0, "step_us": {}, "kind_us": {}, "untimed_us": {},
                                "timed": {}, "parts_us": {}}  # per mode: [timed steps, µs]; {kind: µs in them}
        return self._ranks[key]

    def update(self, chunk: Chunk) -> None:
        self._add_operators((chunk.run or {}).get("operators"))
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        table = cols.table
        dur = np.maximum(cols.end - cols.start, 0)
        is_step = cols.kind_is(STEP)
        # Sampled steps (analyze/sampled.py): from its pause to its resume a rank ran steps of the marker's mode,
        # counted, not timed: that time is in those steps, as a timed step's is.
        untimed = cols.kind_is(UNTIMED)
        timed = ~cols.kind_is(*INSTANT) & ~untimed
        for (node, rank, mode), rows in cols.groups(is_step | untimed):
            r = self._rank((node, rank))
            lo, hi = int(cols.start[rows].min()), int(cols.end[rows].max())
            r["first"] = lo if r["first"] is None else min(r["first"], lo)
            r["last"] = hi if r["last"] is None else max(r["last"], hi)
            r["steps"] += int(is_step[rows].sum())
            r["step_us"][mode] = r["step_us"].get(mode, 0) + int(dur[rows].sum())
            counted = untimed[rows]
            if counted.any():
                r["untimed_us"][mode] = r["untimed_us"].get(mode, 0) + int(dur[rows][counted].sum())
            steps = is_step[rows]
            if steps.any():
                timed_steps = r["timed"].setdefault(mode, [0, 0])
                timed_steps[0] += int(steps.sum())
                timed_steps[1] += int(dur[rows][steps].sum())
        in_steps = cols.kind_is(*PARTS) & (cols.step >= 0)
        for (node, rank, mode), rows in cols.groups(in_steps):
            parts = self._rank((node, rank))["parts_us"].setdefault(mode, {})
            kinds = cols.kind[rows]
            for code in np.flatnonzero(np.bincount(kinds)).tolist():
                kind = cols.kinds[code]
                parts[kind] = parts.get(kind, 0) + int(dur[rows][kinds == code].sum())
        for (node, rank), rows in cols.groups(timed & ~is_step, by_mode=False):
            r = self._rank((node, rank))
            kinds = cols.kind[rows]
            for code in np.flatnonzero(np.bincount(kinds)).tolist():  # the kinds present, in code order
                kind = cols.kinds[code]
                r["kind_us"][kind] = r["kind_us"].get(kind, 0) + int(dur[rows][kinds == code].sum())
        sel = np.flatnonzero(timed & ~is_step)
        if sel.size:
            name_codes, names = text_codes(table["name"])
            key = cols.kind[sel] * len(names) + name_codes[sel]
            if int(key.max()) < 1 << 16:  # few (kind, name) pairs: count them, and sum after a radix sort
                per_key = np.bincount(key)
                uniq = np.flatnonzero(per_key)
                counts = per_key[uniq]
                order = np.argsort(key.astype(np.uint16), kind="stable")
                sums = np.add.reduceat(dur[sel][order], np.concatenate([[0], np.cumsum(counts)[:-1]]))
            else:
                uniq, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
                sums = np.zeros(len(uniq), np.int64)
                np.add.at(sums, inv, dur[sel])
            for k, c, s in zip(uniq.tolist(), counts.tolist(), sums.tolist()):
                kc, nc = divmod(k, len(names))
                entry = self._names.setdefault((cols.kinds[kc], names[nc]), [0, 0])
                entry[0] += c
                entry[1] += s

    def merge(self, other: Rule, node: str) -> None:
        """Integer sums per key add up; a key new here goes after this rule's, in `other`'s order, as when fed
        after it (a rank's `untimed_us` order reaches the JSON)."""
        assert isinstance(other, OverallFrameworkMetrics)
        self._events += other._events
        for key, theirs in other._ranks.items():
            if key not in self._ranks:
                self._ranks[key] = theirs
                continue
            r = self._ranks[key]
            if theirs["first"] is not None:
                r["first"] = theirs["first"] if r["first"] is None else min(r["first"], theirs["first"])
                r["last"] = theirs["last"] if r["last"] is None else max(r["last"], theirs["last"])
            r["steps"] += theirs["steps"]
            for part in ("step_us", "kind_us", "untimed_us"):
                for k, v in theirs[part].items():
                    r[part][k] = r[part].get(k, 0) + v
            for mode, (n, us) in theirs["timed"].items():
                mine = r["timed"].setdefault(mode, [0, 0])
                mine[0] += n
                mine[1] += us
            for mode, parts in theirs["parts_us"].items():
                own = r["parts_us"].setdefault(mode, {})
                for k, v in parts.items():
                    own[k] = own.get(k, 0) + v
        for name, (count, us) in other._names.items():
            entry = self._names.setdefault(name, [0, 0])
            entry[0] += count
            entry[1] += us
        self._operators.update(other._operators)  # de-duplicated by key: later rows replace, as fed

    def _add_operators(self, rows: Any) -> None:
        if rows is None:
            return
        if isinstance(rows, pa.Table):
            rows = rows.to_pylist()
        for row in rows:
            key = tuple(str(row.get(k)) for k in _OP_KEY)
            self._operators[key] = row

    def result(self) -> RuleResult:
        if self._events == 0:
            return self.not_applicable("no framework data: the training loop was not recorded (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        total_phase: dict[str, int] = {}
        total_kind: dict[str, int] = {}
        total_untimed: dict[str, int] = {}
        total_timed: dict[str, list[int]] = {}
        total_parts: dict[str, dict[str, int]] = {}
        ranks: dict[str, Any] = {}
        for (node, rank) in sorted(self._ranks):
            r = self._ranks[(node, rank)]
            phase_us = {m: r["step_us"][m] for m in sorted(r["step_us"], key=mode_order)}
            if r["first"] is not None:
                phase_us[OTHERS] = max(r["last"] - r["first"] - sum(r["step_us"].values()), 0)
            for k, v in phase_us.items():
                total_phase[k] = total_phase.get(k, 0) + v
            for k, v in r["kind_us"].items():
                total_kind[k] = total_kind.get(k, 0) + v
            for k, v in r["untimed_us"].items():
                total_untimed[k] = total_untimed.get(k, 0) + v
            for mode, (n, us) in r["timed"].items():
                t = total_timed.setdefault(mode, [0, 0])
                t[0] += n
                t[1] += us
            for mode, parts in r["parts_us"].items():
                acc = total_parts.setdefault(mode, {})
                for k, v in parts.items():
                    acc[k] = acc.get(k, 0) + v
            ranks[rank_key(node, rank)] = {
                "steps": r["steps"],
                "phase": _percent(phase_us), "phase_us": phase_us,
                "untimed_us": dict(r["untimed_us"]),
                "forward_backward": _percent(_training_fb(r["parts_us"])),
                "modes": _modes(r["timed"], r["parts_us"]),
                "general_us": _pick(r["kind_us"], GENERAL),
                "events_us": dict(sorted(r["kind_us"].items())),
            }
        phase_us = {k: total_phase[k] for k in sorted(total_phase, key=lambda m: (m == OTHERS, mode_order(m)))}
        fb_us = _training_fb(total_parts)
        general_us = _pick(total_kind, GENERAL)
        details: dict[str, Any] = {
            "phase": _percent(phase_us), "phase_us": phase_us,
            "untimed_us": total_untimed,  # of phase_us: steps counted, not timed (their phases are unknown)
            "forward_backward": _percent(fb_us), "forward_backward_us": fb_us,  # in training steps (not EVAL)
            "modes": _modes(total_timed, total_parts),
            "general": _percent(general_us), "general_us": general_us,
            "events": self._event_names(),
            "ranks": ranks,
        }
        details.update(self._operator_tables())
        return self.make_result(triggered=0, violations=0, datapoints=self._events, details=details)

    def _event_names(self) -> dict[str, dict[str, dict[str, int]]]:
        out: dict[str, dict[str, dict[str, int]]] = {}
        for kind in sorted({k for k, _ in self._names}):
            items = sorted(((n, v) for (k, n), v in self._names.items() if k == kind),
                           key=lambda kv: (-kv[1][1], kv[0]))
            out[kind] = {n: {"count": c, "total_us": us} for n, (c, us) in items[:MAX_NAMES]}
        return out

    def _operator_tables(self) -> dict[str, Any]:
        if not self._operators:
            return {}
        per_device: dict[str, dict[str, list[float]]] = {}
        windows = set()
        for key in sorted(self._operators):
            row = self._operators[key]
            label = DEVICES.get(str(row.get("device")).lower(), str(row.get("device")).upper())
            windows.add(key[:3])
            ops = per_device.setdefault(label, {})
            acc = ops.setdefault(str(row.get("operator")), [0, 0.0, 0.0])
            acc[0] += int(row.get("calls") or 0)
            acc[1] += float(row.get("self_us") or 0.0)
            acc[2] += float(row.get("total_us") or 0.0)
        out: dict[str, Any] = {"operator_windows": len(windows), "operators": {}}
        device_self = {}
        for label in sorted(per_device):
            ops = per_device[label]
            total = sum(v[1] for v in ops.values())
            device_self[label] = total
            ranked = sorted(ops.items(), key=lambda kv: (-kv[1][1], kv[0]))[:MAX_OPERATORS]
            pct = {op: (100.0 * v[1] / total if total > 0 else 0.0) for op, v in ranked}
            out[label] = pct
            out[f"{label}_total"] = {op: v[1] for op, v in ranked}
            out["operators"][label] = [{"operator": op, "calls": v[0], "self_us": v[1], "total_us": v[2],
                                        "percent": pct[op]} for op, v in ranked]
            out["operators"][f"{label}_count"] = len(ops)
        out["ratio"] = _percent(device_self)
        return out


def _training_fb(parts_us: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Forward and backward µs in the steps of every mode but EVAL: an evaluation's forwards are not training's
    (nanoGPT read "forward 53 %" for 39 % in its training steps)."""
    out: dict[str, int] = {}
    for mode, parts in parts_us.items():
        if mode == EVAL:
            continue
        for kind in (FORWARD, BACKWARD):
            if parts.get(kind):
                out[kind] = out.get(kind, 0) + parts[kind]
    return {k: out[k] for k in (FORWARD, BACKWARD) if k in out}


def _modes(timed: Mapping[str, list[int]], parts_us: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """Per mode with timed steps: their count and µs, each part's µs and its share of that time (% , largest
    first; "other" is the time in no part). Parts that overlap (a collective inside backward) make the shares
    of their sum instead, so that they never add up past 100 %."""
    out: dict[str, Any] = {}
    for mode in sorted(timed, key=mode_order):
        n, step_us = timed[mode]
        if n <= 0 or step_us <= 0:
            continue
        parts = {k: int(v) for k, v in (parts_us.get(mode) or {}).items() if v > 0}
        parts[OTHER] = max(step_us - sum(parts.values()), 0)
        whole = max(step_us, sum(parts.values()))
        shares = {k: 100.0 * v / whole for k, v in sorted(parts.items(), key=lambda kv: (-kv[1], kv[0])) if v > 0}
        out[mode] = {"steps": n, "step_us": step_us, "parts_us": {k: parts[k] for k in shares}, "parts": shares}
    return out


def _pick(values: dict[str, int], keys: tuple[str, ...]) -> dict[str, int]:
    return {k: values[k] for k in keys if values.get(k)}


def _percent(values: Mapping[str, float]) -> dict[str, float]:
    """Each value's share of their sum, in %, largest first (the report's pie charts read the first key)."""
    total = sum(values.values())
    if total <= 0:
        return {}
    return {k: 100.0 * v / total for k, v in sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))}
