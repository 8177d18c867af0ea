"""SageMaker's framework trace files (Chrome trace-event JSON, one event a line) as timed events.

Conventions of those files, as SageMaker's own readers applied them: times are µs relative to the file's
`start_time_since_epoch_in_micros` (a `process_name` metadata event of pid 0; a file without one keeps the
previous file's); each `pid` of a file is a training phase named by its `process_name` event; complete (`X`)
events carry their duration; a begin (`B`) event is closed by the next end (`E`) event of the same pid, in the
same file or a later one of the same process and kind; instant and other events are not timed work and are
counted, not kept. Unlike SageMaker (which dropped a file whose JSON did not parse), a file is read line by
line, so a half-written last line — a killed job's — costs that line only."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stallwatch.importers.sagemaker.lines import line_blocks
from stallwatch.importers.sagemaker.timestamps import epoch_to_us
from stallwatch.store.location import RunLocation

WHOLE_FILE_LIMIT = 256 * 2**20  # a file that is not one event a line is parsed whole only up to this size


@dataclass(frozen=True)
class RawEvent:
    phase: str  # the pid's process name (SageMaker's "training phase"), "" when the file names none
    name: str
    start_us: int
    end_us: int
    args: dict[str, Any]


@dataclass
class TraceStats:
    """What reading one kind of trace file of one process found (SageMaker's event count is `events`)."""

    files: int = 0
    events: int = 0  # complete events, and begin/end pairs matched
    skipped_phases: Counter = field(default_factory=Counter)  # "i", "C", … events: not timed work
    unmatched_end: int = 0  # an E without an open B of its pid
    unmatched_begin: int = 0  # B events never closed (set by `finish`)
    negative: int = 0  # an end before its start
    corrupt_lines: int = 0
    corrupt_last_lines: int = 0
    unreadable_files: int = 0
    start_us: int | None = None
    end_us: int | None = None


class TraceStream:
    """The trace files of one kind of one process, read in order; state carries from file to file."""

    def __init__(self) -> None:
        self.stats = TraceStats()
        self._base_us = 0
        self._names: dict[str, str] = {}  # trace pid -> process name
        self._open: dict[str, list[dict[str, Any]]] = {}  # trace pid -> begun events

    def read_file(self, source: RunLocation, path: str,
                  keep_line: Callable[[bytes], bool] | None = None) -> Iterator[RawEvent]:
        """The file's events in file order. `keep_line`: a cheap byte test that skips lines unparsed (the
        first pass that only looks for steps)."""
        self.stats.files += 1
        first = True
        for block, last in line_blocks(source, path, on_long_line=self._long_line):
            lines = block.split(b"\n")
            content = [i for i, ln in enumerate(lines) if ln.strip() not in (b"", b"[", b"]")]
            last_index = content[-1] if (last and content) else -1
            for i in content:
                raw = lines[i].strip()
                if raw.endswith(b","):
                    raw = raw[:-1]
                if raw.startswith(b"["):
                    raw = raw[1:].lstrip()
                if keep_line is not None and not keep_line(raw):
                    first = False
                    continue
                try:
                    event = json.loads(raw)
                except (ValueError, RecursionError):
                    if first:  # not one event a line (a pretty-printed or single-line file): parse it whole
                        yield from self._whole_file(source, path)
                        return
                    if i == last_index:
                        self.stats.corrupt_last_lines += 1
                    self.stats.corrupt_lines += 1
                    continue
                first = False
                if isinstance(event, dict):
                    out = self._event(event)
                    if out is not None:
                        yield out
                else:
                    self.stats.corrupt_lines += 1

    def _long_line(self) -> None:
        self.stats.corrupt_lines += 1

    def finish(self) -> TraceStats:
        self.stats.unmatched_begin += sum(len(v) for v in self._open.values())
        self._open.clear()
        return self.stats

    def _whole_file(self, source: RunLocation, path: str) -> Iterator[RawEvent]:
        try:
            with source.open_input_stream(path) as fh:
                data = fh.read(WHOLE_FILE_LIMIT + 1)
            if len(data) > WHOLE_FILE_LIMIT:
                raise ValueError(f"larger than {WHOLE_FILE_LIMIT // 2**20} MB and not one event a line")
            parsed = json.loads(data)
        except (ValueError, RecursionError, OSError):
            self.stats.unreadable_files += 1
            return
        events = parsed.get("traceEvents") if isinstance(parsed, dict) else parsed
        if not isinstance(events, list):
            self.stats.unreadable_files += 1
            return
        for event in events:
            if isinstance(event, dict):
                out = self._event(event)
                if out is not None:
                    yield out

    def _event(self, e: dict[str, Any]) -> RawEvent | None:
        ph = e.get("ph")
        if not isinstance(ph, str):
            return None
        pid = str(e.get("pid"))
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if ph == "M":
            if e.get("name") == "process_name":
                if "name" in args:
                    self._names[pid] = str(args["name"])
                start = args.get("start_time_since_epoch_in_micros")
                if _number(start) and start > 0:
                    self._base_us = epoch_to_us(start)
            return None
        if ph == "X":
            ts, dur = e.get("ts"), e.get("dur")
            if not (_number(ts) and _number(dur)):
                self.stats.corrupt_lines += 1
                return None
            return self._made(pid, str(e.get("name", "")), ts, ts + dur, args)
        if ph == "B":
            if _number(e.get("ts")):
                self._open.setdefault(pid, []).append(e)
            else:
                self.stats.corrupt_lines += 1
            return None
        if ph == "E":
            stack = self._open.get(pid)
            if not stack:
                self.stats.unmatched_end += 1
                return None
            begin = stack.pop()
            if not _number(e.get("ts")):
                self.stats.corrupt_lines += 1
                return None
            return self._made(pid, str(begin.get("name", "")), begin["ts"], e["ts"], args)
        self.stats.skipped_phases[ph] += 1
        return None

    def _made(self, pid: str, name: str, ts: float, end: float, args: dict[str, Any]) -> RawEvent | None:
        start_us = int(round(self._base_us + ts))
        end_us = int(round(self._base_us + end))
        if end_us < start_us:
            self.stats.negative += 1
            return None
        s = self.stats
        s.events += 1
        s.start_us = start_us if s.start_us is None else min(s.start_us, start_us)
        s.end_us = end_us if s.end_us is None else max(s.end_us, end_us)
        return RawEvent(self._names.get(pid, ""), name, start_us, end_us, args)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
