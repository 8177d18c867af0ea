"""The job at a glance: what ran, when, for how long, on which nodes and ranks, how many steps of each phase,
how its time split (initialization, training loop, finalization) — and its fate: still running, succeeded,
failed, killed or interrupted, with the exit code or signal. A run that crashed never reads as healthy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from stallwatch.analyze.steps import LoopSpan
from stallwatch.store.node_record import NodeRecord, as_record

RUNNING, SUCCEEDED, FAILED, KILLED, INTERRUPTED, STOPPED, UNKNOWN = (
    "running", "succeeded", "failed", "killed", "interrupted", "stopped", "unknown")
INTERRUPTING = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")  # someone asked the job to stop


@dataclass(frozen=True)
class JobFate:
    """How the job ended (or that it has not yet). `code` is the command's exit code as a shell reports it
    (128+N for signal N); `signal` the signal that ended it; `interrupted` when it did not end on its own."""
    state: str
    code: int | None = None
    signal: str | None = None
    interrupted: bool = False
    stop_reason: str | None = None  # training stopped on request (`stop_training`): the reason recorded
    node: str | None = None  # the node whose fate this is, on multi-node runs (the worst one)

    @property
    def ok(self) -> bool:
        """Ended on its own with exit code 0 (a run still going is not judged yet)."""
        return self.state == SUCCEEDED

    @property
    def ended_badly(self) -> bool:
        return self.state in (FAILED, KILLED, INTERRUPTED)

    def phrase(self) -> str:
        """"exited with code 0", "was killed by SIGKILL (exit code 137)", "is still running"…"""
        where = f" on node {self.node}" if self.node else ""
        if self.state == RUNNING:
            return "is still running"
        if self.state == UNKNOWN:
            return f"ended without recording its exit status{where} (stallwatch itself was stopped)"
        code = f"exit code {self.code}" if self.code is not None else "no exit code"
        if self.state == INTERRUPTED:
            return f"was interrupted by {self.signal or 'a signal'}{where} ({code})"
        if self.state == KILLED:
            return f"was killed by {self.signal}{where} ({code})"
        if self.state == FAILED:
            return f"failed{where} with {code}"
        if self.state == STOPPED:
            return f"stopped training on request ({self.stop_reason}) and exited with code {self.code}"
        return f"exited with code {self.code}"

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "code": self.code, "signal": self.signal, "interrupted": self.interrupted,
                "stop_reason": self.stop_reason, "node": self.node}


_SEVERITY = {UNKNOWN: 1, STOPPED: 2, RUNNING: 3, INTERRUPTED: 4, KILLED: 5, FAILED: 6, SUCCEEDED: 0}


def node_fate(record: NodeRecord | Mapping[str, Any], stop_reason: str | None = None) -> JobFate:
    """One node's fate from its record (`nodes/<node>.json`): status, exit code and signal (older runs: a code
    of 128+N with N a signal is read as that signal; `NodeRecord.exit_signal`), and whether it was asked to stop."""
    rec = as_record("", record)
    code = rec.exit_code
    if code is None:
        return JobFate(UNKNOWN if rec.finished or rec.status is None else RUNNING, stop_reason=stop_reason)
    sig = rec.exit_signal
    interrupted = rec.interrupted or sig in INTERRUPTING
    if sig is not None:
        return JobFate(INTERRUPTED if interrupted else KILLED, code, sig, True, stop_reason)
    if code != 0:
        # asked to stop and ended by stallwatch's signal (a hung job never reaches the step boundary where it would
        # stop on its own: `Hang=stop_training`): stopped on request, not a failure of the job's own
        stopped = stop_reason is not None and interrupted
        return JobFate(STOPPED if stopped else FAILED, code, None, interrupted, stop_reason)
    return JobFate(STOPPED if stop_reason else SUCCEEDED, code, None, False, stop_reason)


def job_fate(records: Mapping[str, NodeRecord | Mapping[str, Any]], stop_reason: str | None = None) -> JobFate:
    """The run's fate: the worst of its nodes' (a failure anywhere is the job's), naming the node when
    there are several."""
    if not records:
        return JobFate(UNKNOWN, stop_reason=stop_reason)
    fates = {node: node_fate(rec, stop_reason) for node, rec in records.items()}
    node, worst = max(fates.items(), key=lambda kv: (_SEVERITY[kv[1].state], kv[0]))
    if len(fates) > 1 and worst.state != SUCCEEDED:
        return JobFate(worst.state, worst.code, worst.signal, worst.interrupted, worst.stop_reason, node)
    return worst


@dataclass(frozen=True)
class JobSummary:
    """The job's span and shape. Times are µs since the epoch; `end_us` is None while no node has ended (then
    `data_end_us` is the newest data)."""
    run_id: str
    uri: str
    command: list[str]
    start_us: int | None
    end_us: int | None
    data_end_us: int | None
    nodes: list[str]
    ranks: dict[str, list[str]]
    steps: dict[str, int]  # per mode, all ranks together
    loop: LoopSpan | None
    sample_interval_ms: dict[str, float]
    fate: JobFate
    notes: list[str] = field(default_factory=list)  # what the run itself says about its measurements
    loop_undetermined: list[str] = field(default_factory=list)  # node/rank places whose steps could not be found
    timed_share: float = 1.0  # of the steps, those timed (< 1 where steps were sampled: analyze/sampled.py)

    @property
    def last_us(self) -> int | None:
        return self.end_us if self.end_us is not None else self.data_end_us

    @property
    def duration_s(self) -> float:
        if self.start_us is None or self.last_us is None:
            return 0.0
        return max(self.last_us - self.start_us, 0) / 1e6

    @property
    def total_steps(self) -> int:
        return sum(self.steps.values())

    def parts_s(self) -> dict[str, float] | None:
        """Initialization, training loop, finalization in seconds (clamped at 0: clocks of nodes differ);
        None without steps."""
        if self.loop is None or self.start_us is None:
            return None
        end = self.last_us if self.last_us is not None else self.loop.last_us
        return {"Initialization": max(self.loop.first_us - self.start_us, 0) / 1e6,
                "Training loop": max(self.loop.last_us - self.loop.first_us, 0) / 1e6,
                "Finalization": max(end - self.loop.last_us, 0) / 1e6}

    @property
    def loop_s(self) -> float:
        parts = self.parts_s()
        return parts["Training loop"] if parts else 0.0

    @property
    def ended_before_first_step(self) -> str | None:
        """Why the run has no step when its job ended badly before its first one ("the job failed with exit code 1
        after 4.2 s, before its first step"); None otherwise. Such a run was profiled: no hint to run it under
        `stallwatch run`."""
        if self.total_steps or not self.fate.ended_badly:
            return None
        from stallwatch.timeutil import format_duration

        return f"the job {self.fate.phrase()} after {format_duration(self.duration_s)}, before its first step"
