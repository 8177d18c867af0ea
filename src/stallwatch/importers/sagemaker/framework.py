"""SageMaker's framework events -> stallwatch framework events of one rank, streamed into `FrameworkWriter`.

A SageMaker process (its node id "<rank or pid>-<host>") is a rank of a node. Its `Step:ModeKeys.<MODE>`
events become steps of that mode, numbered as SageMaker numbered them (per mode, from 0); every other event
takes the mode and number of the step it starts in (time containment, as stallwatch's hooks record it), or
GLOBAL and none outside steps. Steps are read first (one cheap pass over the Python timelines, kept as a few
arrays), then every file is read once, in time order, and written in batches: memory holds one batch."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallwatch import records as r
from stallwatch.importers.sagemaker.discovery import TraceFile
from stallwatch.importers.sagemaker.trace_events import RawEvent, TraceStats, TraceStream
from stallwatch.log import logger
from stallwatch.records import FrameworkEvent
from stallwatch.store.chunk_writer import SEGMENT_US, StorageBudget
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation

BATCH = 50_000  # events converted and written at a time
STEP_PREFIX = "Step:ModeKeys."
_MODES = {"TRAIN": (r.TRAIN, "train_step"), "EVAL": (r.EVAL, "eval_step"),
          "PREDICT": (r.GLOBAL, "predict_step"), "GLOBAL": (r.GLOBAL, "step")}
# SageMaker's training phase (a trace pid's process name) -> stallwatch kind. See docs/format.md.
PHASE_KINDS = {
    "Forward": r.FORWARD,
    "Backward(post-forward)": r.BACKWARD,
    "Forward-SubModuleInternal": "module_forward",
    "Backward-SubModuleInternal": "module_backward",
    "DataLoaderIter": r.DATA_WAIT,
    "DataLoaderIterInitialize": "dataloader",
    "DataLoaderWorker": "dataloader_worker",
    "DataIterator": "data_iterator",
    "cpu_functions": "cpu_op",
    "NcclManager": r.COLLECTIVE,
}
_GPU_FUNCTIONS = re.compile(r"^gpu_functions-dev:(.*)$")
_DROPPED_ARGS = ("step_num", "pid", "start_time_since_epoch_in_micros")


@dataclass
class ProcessStats:
    """One SageMaker process imported as one rank."""

    process: str
    node: str
    rank: str
    pid: int | None = None
    by_file_kind: dict[str, TraceStats] = field(default_factory=dict)
    kinds: Counter = field(default_factory=Counter)  # stallwatch kind -> events
    steps: Counter = field(default_factory=Counter)  # mode -> steps
    events_written: int = 0
    events_dropped: int = 0  # the writer could not store them
    start_us: int | None = None
    end_us: int | None = None
    step_index: "StepIndex | None" = field(default=None, repr=False)  # where windows find their steps


class StepIndex:
    """A process's steps, sorted by start, as arrays (a few bytes a step): which step an event starting at t
    lies in."""

    MODES = (r.TRAIN, r.EVAL, r.GLOBAL)

    def __init__(self, steps: list[tuple[int, int, str, int]]) -> None:
        steps.sort()
        self.starts = np.array([s[0] for s in steps], dtype=np.int64)
        self.ends = np.array([s[1] for s in steps], dtype=np.int64)
        self.mode_codes = np.array([self.MODES.index(s[2]) for s in steps], dtype=np.int8)
        self.numbers = np.array([s[3] for s in steps], dtype=np.int64)

    def mode(self, i: int) -> str:
        return self.MODES[int(self.mode_codes[i])]

    def lookup(self, starts: np.ndarray) -> np.ndarray:
        """For each start time, the index of the step it lies in, -1 outside steps."""
        if not len(self.starts):
            return np.full(len(starts), -1, dtype=np.int64)
        i = np.searchsorted(self.starts, starts, side="right") - 1
        inside = (i >= 0) & (starts <= self.ends[np.clip(i, 0, None)])
        return np.where(inside, i, -1)

    def train_steps_in(self, start_us: int, end_us: int) -> tuple[int, int] | None:
        """First and last number of the TRAIN steps starting in [start_us, end_us]."""
        sel = (self.starts >= start_us) & (self.starts <= end_us) & (self.mode_codes == self.MODES.index(r.TRAIN))
        if not sel.any():
            return None
        return int(self.numbers[sel].min()), int(self.numbers[sel].max())


MAX_STEP_NUMBER = 1 << 62


def step_of(event: RawEvent) -> tuple[str, str, int | None] | None:
    """(mode, step name, SageMaker's step number) of a step event; None for any other event."""
    label = event.phase if event.phase.startswith(STEP_PREFIX) else event.name
    if not label.startswith(STEP_PREFIX):
        return None
    mode, name = _MODES.get(label[len(STEP_PREFIX):].upper(), (r.GLOBAL, "step"))
    number = event.args.get("step_num")
    try:
        step = int(number)
    except (TypeError, ValueError, OverflowError):
        return mode, name, None
    # a number no int64 column can hold (10^30, -1) is no step number: the step keeps its place by time
    return mode, name, step if 0 <= step < MAX_STEP_NUMBER else None


def kind_and_name(event: RawEvent, file_kind: str) -> tuple[str, str, dict[str, Any]]:
    """stallwatch kind, name and the args kept (SageMaker's own, less what the columns hold, plus the phase
    where the kind does not tell it)."""
    args = {k: v for k, v in event.args.items() if k not in _DROPPED_ARGS}
    if file_kind in ("horovod_timeline", "smdataparallel_timeline"):
        if event.phase:
            args["tensor"] = event.phase  # Horovod names each pid after the tensor it reduces
        return r.COLLECTIVE, event.name, args
    kind = PHASE_KINDS.get(event.phase)
    if kind is None:
        m = _GPU_FUNCTIONS.match(event.phase)
        if m:
            args["device"] = m.group(1)
            kind = "gpu_op"
        else:
            kind = "other"
            if event.phase:
                args["phase"] = event.phase
    if kind == r.DATA_WAIT and not event.name:
        return kind, "next_batch", args
    return kind, event.name, args


def read_steps(source: RunLocation, files: Iterable[TraceFile]) -> StepIndex:
    """The first pass: only the step events (and the metadata lines that place them in time)."""
    stream = TraceStream()
    steps: list[tuple[int, int, str, int]] = []
    counters: Counter = Counter()
    for f in files:
        for event in stream.read_file(source, f.path, keep_line=_step_or_metadata):
            found = step_of(event)
            if found is None:
                continue
            mode, _, number = found
            if number is None:
                number = counters[mode]
            counters[mode] = number + 1
            steps.append((event.start_us, event.end_us, mode, number))
    return StepIndex(steps)


def _step_or_metadata(line: bytes) -> bool:
    return b"Step:" in line or b"process_name" in line or b"start_time_since_epoch" in line


def import_process(source: RunLocation, sink: RunLocation, process: str, node: str, rank: str,
                   files: list[TraceFile], budget: StorageBudget) -> ProcessStats:
    """All trace files of one SageMaker process into framework/<node>/<rank>/."""
    stats = ProcessStats(process, node, rank)
    steps = read_steps(source, [f for f in files if f.kind == "pythontimeline"])
    writer = FrameworkWriter(sink, node, rank, flush_interval_us=SEGMENT_US, max_bytes=budget.limit, budget=budget)
    streams: dict[str, TraceStream] = {}
    counters: Counter = Counter()
    for f in sorted(files, key=lambda f: (f.time_us, f.kind, f.path)):
        stream = streams.setdefault(f.kind, TraceStream())
        batch: list[RawEvent] = []
        for event in stream.read_file(source, f.path):
            batch.append(event)
            if len(batch) >= BATCH:
                _write_batch(batch, f.kind, steps, writer, stats, counters)
                batch = []
        _write_batch(batch, f.kind, steps, writer, stats, counters)
    writer.close()
    stats.by_file_kind = {kind: s.finish() for kind, s in streams.items()}
    stats.events_dropped = writer.samples_dropped
    stats.step_index = steps
    if writer.samples_dropped:
        logger.warning("%d framework events of %s/%s could not be written", writer.samples_dropped, node, rank)
    return stats


def _write_batch(batch: list[RawEvent], file_kind: str, steps: StepIndex, writer: FrameworkWriter,
                 stats: ProcessStats, counters: Counter) -> None:
    if not batch:
        return
    batch.sort(key=lambda e: (e.start_us, -e.end_us))
    inside = steps.lookup(np.array([e.start_us for e in batch], dtype=np.int64))
    for event, at in zip(batch, inside.tolist()):
        pid = _pid(event.args)
        if pid is not None and stats.pid is None:
            stats.pid = pid
        found = step_of(event)
        if found is not None:
            mode, name, number = found
            if number is None:
                number = counters[mode]
            counters[mode] = number + 1
            out = FrameworkEvent(r.STEP, name, event.start_us, event.end_us, mode, number, pid or 0, "")
            stats.steps[mode] += 1
        else:
            kind, name, args = kind_and_name(event, file_kind)
            mode, number = (steps.mode(at), int(steps.numbers[at])) if at >= 0 else (r.GLOBAL, None)
            text = json.dumps(args, sort_keys=True, default=str) if args else ""
            out = FrameworkEvent(kind, name, event.start_us, event.end_us, mode, number, pid or 0, text)
        stats.kinds[out.kind] += 1
        writer.append(out)
        writer.tick(out.start_us)
        stats.events_written += 1
        stats.start_us = out.start_us if stats.start_us is None else min(stats.start_us, out.start_us)
        stats.end_us = out.end_us if stats.end_us is None else max(stats.end_us, out.end_us)


def _pid(args: dict[str, Any]) -> int | None:
    value = args.get("pid")
    if isinstance(value, bool):
        return None
    try:
        pid = int(value)
    except (TypeError, ValueError):
        return None
    return pid if 0 < pid < 2**31 else None
