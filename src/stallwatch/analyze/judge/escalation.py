"""From finding to evidence, while the job runs: when a live rule fires, a short detailed capture of the next
seconds is asked for through the run's live configuration — torch.profiler operators always, data-loader
timing where the finding is about the input pipeline, Python profiling where it points at the host CPU.
Within a budget: one capture per rule per `escalate_every_s`, and captured time at most `escalate_budget_pct` of
the job's time so far. Each capture is recorded with its trigger in escalations/ (through the store)."""

from __future__ import annotations

import time
from typing import Any

from stallwatch.config import ProfilerConfig, ProfilingRange
from stallwatch.log import logger, warn_once
from stallwatch.store import run_files

CAPTURE_S = 5.0  # a capture's length (a detailed window also stops after 100 steps)
LEAD_S = 1.0  # the capture starts this long after the rule fired: the job picks the config up at a step boundary
INPUT_RULES = ("InputBound", "Dataloader", "StepOutlier")  # + data-loader timing
HOST_RULES = ("CPUBottleneck", "IOBottleneck")  # + Python profiling
OTHER_RULES = ("LowGPUUtilization", "Straggler", "CommunicationBound", "GPUMemoryIncrease", "BatchSize")
MEMORY_RULES = ("MemoryGrowth",)  # + where memory grows: tracemalloc snapshots 5 steps apart (no operators)
# A memory capture ends after 6 steps, or at the first step boundary 5 s after it began (MAX_CAPTURE_S); it is
# counted against the budget as those 5 s, its bound (docs/benchmarks.md: ~35 ms of snapshots and diff on a small
# loop, and the steps it covers slowed by tracing, up to 40x for a loop that allocates a million Python objects)
MEMORY_WINDOW_S = 120.0
MEMORY_COST_S = 5.0


class Escalation:
    """`on_results(results)` after each live evaluation (in the launcher's process, never the job's)."""

    def __init__(self, config: ProfilerConfig, location: Any, start_us: int) -> None:
        self.config = config
        self.location = location
        self.start_us = start_us
        self._last: dict[str, float] = {}  # rule -> when it last asked for a capture (monotonic s)
        self._seen: dict[str, int] = {}  # rule -> triggered count at the last evaluation
        self.captured_s = 0.0
        self.records: list[dict[str, Any]] = []
        # rules that fired while the budget had no room: asked again at each evaluation while they still fire (a
        # rule that fires early in a job would otherwise never get its capture: its count stops growing)
        self._deferred: set[str] = set()

    def on_results(self, results: list, now_us: int | None = None) -> None:
        if not self.config.escalate:
            return
        now_us = now_us if now_us is not None else time.time_ns() // 1000
        for r in results:
            grew = r.triggered > self._seen.get(r.name, 0)
            self._seen[r.name] = r.triggered
            waiting = r.name in self._deferred and r.triggered > 0
            if not (grew or waiting) or r.name not in (*INPUT_RULES, *HOST_RULES, *OTHER_RULES, *MEMORY_RULES):
                continue
            try:
                self._consider(r, now_us)
            except Exception as exc:  # a store that does not answer: the job and the evaluation go on
                warn_once(f"escalate-{r.name}", "could not ask for a capture for %s (%s: %s)", r.name,
                          type(exc).__name__, exc)

    def _consider(self, result: Any, now_us: int) -> None:
        mono = time.monotonic()
        last = self._last.get(result.name)
        if last is not None and mono - last < self.config.escalate_every_s:
            return
        elapsed_s = max(now_us - self.start_us, 0) / 1e6
        cost_s = MEMORY_COST_S if result.name in MEMORY_RULES else CAPTURE_S
        if self.captured_s + cost_s > elapsed_s * self.config.escalate_budget_pct / 100.0:
            self._deferred.add(result.name)
            warn_once(f"escalate-budget-{result.name}", "rule %s fired; no automatic capture: it would exceed the "
                      "budget of %.1f %% of the job's time (escalate_budget_pct) yet; asked again while it fires",
                      result.name, self.config.escalate_budget_pct)
            return
        self._deferred.discard(result.name)
        current = run_files.read_config(self.location)
        if result.name in MEMORY_RULES:
            self._memory(result, current, now_us, mono)
            return
        busy = current.detailed_profiling
        if busy is not None and (busy.by_steps or (busy.start_time_us or 0) + (busy.duration_s or 0) * 1e6 > now_us):
            warn_once(f"escalate-busy-{result.name}", "rule %s fired; no automatic capture: a detailed-profiling "
                      "window is already asked for (%s)", result.name, busy.to_spec())
            return
        start = now_us + int(LEAD_S * 1e6)
        window = ProfilingRange(start_time_us=start, duration_s=CAPTURE_S)
        layers = ["detailed"]
        changes: dict[str, Any] = {"detailed_profiling": window}
        if result.name in INPUT_RULES:
            layers.append("dataloader")
            changes["dataloader_profiling"] = window
        elif result.name in HOST_RULES:
            layers.append("python")
            changes["python_profiling"] = window
        run_files.write_config(self.location, current.replace(**changes))
        record = {"rule": result.name, "start_us": start, "end_us": start + int(CAPTURE_S * 1e6), "layers": layers,
                  "fired_us": now_us, "evidence": _evidence(result),
                  "reason": f"rule {result.name} fired ({result.triggered} times so far)"}
        run_files.write_escalation(self.location, record)
        self._last[result.name] = mono
        self.captured_s += CAPTURE_S
        self.records.append(record)
        logger.warning("rule %s fired: capturing %s for %.0f s (escalation; --escalate off to disable)",
                       result.name, " + ".join(layers), CAPTURE_S)

    def _memory(self, result: Any, current: ProfilerConfig, now_us: int, mono: float) -> None:
        """MemoryGrowth: a memory window (torch/memory_capture.py), unless one is still open."""
        busy = current.memory_profiling
        if busy is not None and not busy.by_steps and \
                (busy.start_time_us or 0) + (busy.duration_s or 0) * 1e6 > now_us:
            return
        start = now_us + int(LEAD_S * 1e6)
        window = ProfilingRange(start_time_us=start, duration_s=MEMORY_WINDOW_S)
        run_files.write_config(self.location, current.replace(memory_profiling=window))
        record = {"rule": result.name, "start_us": start, "end_us": start + int(MEMORY_WINDOW_S * 1e6),
                  "layers": ["memory"], "fired_us": now_us, "evidence": _evidence(result),
                  "reason": f"rule {result.name} fired ({result.triggered} times so far)"}
        run_files.write_escalation(self.location, record)
        self._last[result.name] = mono
        self.captured_s += MEMORY_COST_S
        self.records.append(record)
        logger.warning("rule %s fired: capturing where memory grows (tracemalloc, 5 steps; escalation; "
                       "--escalate off to disable)", result.name)


def _evidence(result: Any) -> dict[str, Any]:
    """A few of the result's headline numbers (the whole result is in rules/)."""
    details = result.details if isinstance(result.details, dict) else {}
    keep = {k: details[k] for k in ("title", "time_at_stake_s", "steps", "ranks_fired", "nodes") if k in details}
    return {"triggered": result.triggered, "violations": result.violations, **keep}
