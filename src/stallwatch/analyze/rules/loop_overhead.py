"""LoopOverhead: in a loop that iterates no DataLoader, how much of each training step is spent in the loop's own
code, outside every phase the hooks time (the model's forward, backward, the optimizer step, collectives). There
batches built by hand (nanoGPT's `get_batch`: read, slice, stack), and whatever else the loop does every step,
are invisible to every other rule: InputBound measures the wait for a DataLoader's batch, and there is none."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stallwatch.analyze.rules.base import Chunk, ParameterError, Rule, RuleResult
from stallwatch.analyze.rules.gpu import check_counts, check_non_negative, gpu_series
from stallwatch.analyze.rules.steps import Appendable, new_events, rank_key
from stallwatch.records import DATA_WAIT, FORWARD, GPU_UTIL, STEP, TRAIN

US = 1_000_000
MIN_FORWARD_SHARE = 0.5  # the model's forward is timed in at least this share of the steps: the phases are seen
MIN_SHORT_RUN_STEPS = 20  # after patience: fewer steps than a window are judged as one window from this many


class _Rank:
    """One rank's TRAIN steps (number, start, duration), the time of its timed phases by step number, and the
    step numbers with a forward pass and with a data wait."""

    def __init__(self) -> None:
        self.step, self.start, self.dur = Appendable(), Appendable(), Appendable()
        self.phase_step, self.phase = Appendable(), Appendable()
        self.forward_step = Appendable()
        self.waits = 0
        self.count = 0  # steps seen (kept or not)
        self.kept = True

    def let_go(self) -> None:
        """Not judged (its batches come from a DataLoader, its node has GPUs): its steps are counted, not kept."""
        self.kept = False
        self.step, self.start, self.dur = Appendable(), Appendable(), Appendable()
        self.phase_step, self.phase, self.forward_step = Appendable(), Appendable(), Appendable()

    def steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """(numbers, starts, durations, time outside the phases, steps with a forward) in step-number order; a
        step number's first occurrence takes its phases (clipped to its duration)."""
        number, start, dur = self.step.view(), self.start.view(), self.dur.view()
        order = np.lexsort((start, number))
        number, start, dur = number[order], start[order], dur[order]
        timed = np.zeros(len(number), np.int64)
        forwards = 0
        if len(number):
            first = np.r_[True, number[1:] != number[:-1]]
            if self.phase.n:
                ps, pd = self.phase_step.view(), self.phase.view()
                at = np.searchsorted(number, ps)
                ok = (at < len(number)) & (number[np.minimum(at, len(number) - 1)] == ps)
                np.add.at(timed, at[ok], pd[ok])
            forwards = int(np.count_nonzero(np.isin(number[first], self.forward_step.view())))
        outside = dur - np.minimum(timed, dur)
        return number, start, dur, outside, forwards


class LoopOverhead(Rule):
    """Per node and rank, TRAIN steps: the time of each step in none of its timed phases (forward, backward,
    optimizer, collectives), over the whole run and over every window of `window` consecutive steps after the
    first `patience`. A rank fires when a window's share of step time outside the phases exceeds `threshold` %
    and averages more than `min_ms` per step. Judged only for ranks whose batches come from no DataLoader (no
    data wait recorded: with one, InputBound judges the input, and the rest of the loop's own code is seldom
    worth a finding), where the model's forward is timed in most steps (else the phases are not seen, not
    absent), and on nodes without GPU data: there, the host's timings of forward and backward are kernel
    launches and the GPU's work surfaces at the next synchronization (`.item()`), outside every phase.

    Evaluation points: each window position of each rank. RuleTriggered = ranks that fire; Violations = window
    positions above the thresholds; Datapoints = steps evaluated."""

    name = "LoopOverhead"
    metrics = (GPU_UTIL,)
    description = ("In a training loop that uses no DataLoader, measures how much of each step is spent in the "
                   "loop's own code, outside the model's forward and backward and the optimizer step: batches "
                   "built by hand (read, sliced and stacked in the loop), logging and metrics every step, "
                   "synchronizing calls such as .item(), checkpoints.")
    recommendation = ("Move the work out of the training step: serve batches from a DataLoader with worker "
                      "processes (or prefetch the next one in a background thread), log and compute metrics every "
                      "N steps instead of every step, avoid .item() and .cpu() on every step. A Python profiling "
                      "window (stallwatch run --python-profiling 20:5 …) names the functions that take the time.")
    defaults = {"threshold": 20, "min_ms": 1, "window": 100, "patience": 10}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window", "patience")
        check_non_negative(self, "min_ms")
        t = self.params["threshold"]
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or not 0 <= t <= 100:
            raise ParameterError(f"{self.name}.threshold={t!r}: must be a percentage from 0 to 100")
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._judged: dict[tuple[str, int], dict[str, Any]] = {}  # entries of ranks whose node is complete
        self._gpu_nodes: set[str] = set()
        self._events = 0

    def update(self, chunk: Chunk) -> None:
        for node, frame in chunk.system.items():
            if len(frame) and gpu_series(frame, GPU_UTIL):
                self._gpu_nodes.add(node)
        self._add(chunk)
        for node in chunk.done:
            for key in [key for key in self._ranks if key[0] == node]:
                self._judged[key] = self._judge(key, self._ranks.pop(key))

    def _add(self, chunk: Chunk) -> None:
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        train = cols.mode_is([TRAIN]) & (cols.step >= 0)
        steps = cols.kind_is(STEP)
        duration = np.maximum(cols.end - cols.start, 0)
        for (node, rank), rows in cols.groups(cols.kind_is(DATA_WAIT) & train, by_mode=False):
            self._ranks.setdefault((node, rank), _Rank()).waits += len(rows)
        for (node, rank), r in self._ranks.items():
            if r.kept and (r.waits or node in self._gpu_nodes):
                r.let_go()  # a DataLoader's or a GPU node's steps are not judged here: they are only counted
        for (node, rank), rows in cols.groups(steps & train, by_mode=False):
            r = self._ranks.setdefault((node, rank), _Rank())
            r.count += len(rows)
            if r.kept:
                r.step.extend(cols.step[rows])
                r.start.extend(cols.start[rows])
                r.dur.extend(duration[rows])
        for (node, rank), rows in cols.groups(~steps & train, by_mode=False):
            r = self._ranks.setdefault((node, rank), _Rank())
            if r.kept:
                r.phase_step.extend(cols.step[rows])
                r.phase.extend(duration[rows])
        for (node, rank), rows in cols.groups(cols.kind_is(FORWARD) & train, by_mode=False):
            r = self._ranks.setdefault((node, rank), _Rank())
            if r.kept:
                r.forward_step.extend(cols.step[rows])

    def result(self) -> RuleResult:
        if self._events == 0:
            return self.not_applicable("no framework data: the job recorded no steps (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        judged = {**self._judged, **{key: self._judge(key, r) for key, r in self._ranks.items()}}
        judged = {k: e for k, e in judged.items() if e["steps"]}
        if not judged:
            return self.not_applicable("no TRAIN steps with step numbers in the framework data")
        if not any(e["judged"] for e in judged.values()):
            reasons = sorted({e["not_judged"] for e in judged.values()})
            return self.not_applicable("; ".join(reasons))
        details: dict[str, Any] = {}
        triggered = violations = datapoints = 0
        stake = 0.0
        for key in sorted(judged):
            entry = judged[key]
            details[rank_key(*key)] = entry
            if entry["judged"]:
                datapoints += entry["steps"]
            if entry["triggered"]:
                triggered += 1
                violations += entry["windows_above"]
                stake = max(stake, entry["time_at_stake_s"])  # ranks run side by side: the worst one's is the job's
        fired = [e for e in details.values() if e["triggered"]]
        summary: dict[str, Any] = {"ranks": details, "threshold": float(self.params["threshold"]),
                                   "time_at_stake_s": stake, "nodes": sorted({e["node"] for e in fired}),
                                   "ranks_fired": [f"{e['node']}/{e['rank']}" for e in fired]}
        if fired:
            top = max(fired, key=lambda e: e["outside_share"])
            summary["title"] = (f"{top['outside_share']:.0f} % of each training step is spent outside the model, in "
                                f"the loop's own code (rank {top['node']}/{top['rank']}, no DataLoader)"
                                if len(fired) == 1 else
                                f"Up to {top['outside_share']:.0f} % of each training step is spent outside the model, "
                                f"in the loop's own code, on {len(fired)} ranks (no DataLoader)")
        return self.make_result(triggered=triggered, violations=violations, datapoints=datapoints, details=summary,
                                recommendation=self._advice(fired) if fired else None)

    def _judge(self, key: tuple[str, int], r: _Rank) -> dict[str, Any]:
        """One rank's Details entry, with its verdict: all `result()` needs of it once its node is complete."""
        node, rank = key
        threshold, floor_us = float(self.params["threshold"]), float(self.params["min_ms"]) * 1000.0
        window, patience = self.params["window"], self.params["patience"]
        entry: dict[str, Any] = {"node": node, "rank": rank, "steps": r.count, "step_s": None, "outside_s": None,
                                 "outside_share": None, "dataloader": r.waits > 0, "judged": False,
                                 "not_judged": None, "worst_window": None, "windows_above": 0, "triggered": False,
                                 "time_at_stake_s": 0.0}
        if r.waits:
            entry["not_judged"] = "the batches come from a DataLoader (InputBound judges the wait for them)"
            return entry
        if node in self._gpu_nodes:
            entry["not_judged"] = ("a node with GPUs: the host times kernel launches, and the GPU's work shows up "
                                   "outside the phases, where the loop next synchronizes")
            return entry
        number, start, dur, outside, forwards = r.steps()
        n = len(number)
        entry.update(steps=n, step_s=float(dur.sum()) / US, outside_s=float(outside.sum()) / US,
                     outside_share=100.0 * float(outside.sum()) / float(dur.sum()) if dur.sum() else 0.0)
        if n == 0 or forwards < MIN_FORWARD_SHARE * n:
            entry["not_judged"] = "the model's forward pass is not timed in most steps: the phases are not seen"
            return entry
        entry["judged"] = True
        body = slice(min(patience, n), n)
        o, d = outside[body], dur[body]
        if len(d) == 0:
            return entry
        k = min(window, len(d))
        co, cd = np.r_[0, np.cumsum(o)], np.r_[0, np.cumsum(d)]
        osum, dsum = co[k:] - co[:-k], cd[k:] - cd[:-k]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(dsum > 0, 100.0 * osum / np.maximum(dsum, 1), 0.0)
        over = (share > threshold) & (osum / k > floor_us)
        judged = len(d) >= window or len(d) >= MIN_SHORT_RUN_STEPS  # a short run is one window, once long enough
        above = int(np.count_nonzero(over)) if judged else 0
        i = int(np.argmax(share))
        a, b = body.start + i, body.start + i + k - 1
        entry["worst_window"] = {"share": float(share[i]), "outside_ms_per_step": float(osum[i]) / k / 1000.0,
                                 "first_step": int(number[a]), "last_step": int(number[b]),
                                 "start_us": int(start[a]), "end_us": int(start[b] + dur[b]), "steps": k}
        entry.update(windows_above=above, triggered=above > 0,
                     time_at_stake_s=float(outside.sum()) / US if above else 0.0)
        return entry

    def _advice(self, fired: list[dict[str, Any]]) -> str:
        lines = []
        for e in fired[:10]:
            per_step = 1000.0 * e["outside_s"] / max(e["steps"], 1)
            lines.append(f"Rank {e['node']}/{e['rank']} spends {e['outside_share']:.0f} % of its training step time "
                         f"({per_step:.1f} ms a step, {e['outside_s']:.1f} s in all) outside the model's forward and "
                         "backward and the optimizer step. It iterates no DataLoader: if the loop builds its batches "
                         "itself (reading, slicing and stacking samples, like nanoGPT's get_batch), that is where the "
                         "time goes — serve them from a DataLoader with num_workers > 0 over a Dataset of the same "
                         "data, or prefetch the next batch in a background thread while the model trains.")
        return " ".join(lines) + " " + self.recommendation
