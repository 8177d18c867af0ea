"""`stallwatch import-sagemaker`: a SageMaker Debugger profiler output (a local folder or an s3:// prefix) ->
a new stallwatch run. Order: run.json and config.json, system samples node by node, framework events
process by process, profiling windows, rule reports, node records, then run.json again with what the
import counted. Everything is written through `stallwatch.store`; a source file is read in blocks."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import groupby
from posixpath import basename
from typing import Any, Callable

from stallwatch import __version__
from stallwatch.config import MAX_SAMPLE_INTERVAL_MS, MIN_SAMPLE_INTERVAL_MS, ProfilerConfig
from stallwatch.importers.sagemaker.discovery import Listing, discover, node_name, split_process
from stallwatch.importers.sagemaker.framework import ProcessStats, StepIndex, import_process
from stallwatch.importers.sagemaker.profiles import WindowImporter, WindowStats
from stallwatch.importers.sagemaker.rules import RuleStats, import_rules
from stallwatch.importers.sagemaker.system import NodeSystemImporter, NodeSystemStats
from stallwatch.log import logger
from stallwatch.store import layout, run_files, run_writer
from stallwatch.store.chunk_writer import StorageBudget
from stallwatch.store.location import RunLocation

FROM = "SageMaker Debugger"
_UNLIMITED = 1 << 62


class SourceError(ValueError):
    """The source cannot be imported (missing, unreachable, or no SageMaker Debugger output in it)."""


@dataclass
class ImportSummary:
    source: str
    out: str
    run_id: str
    nodes: dict[str, NodeSystemStats] = field(default_factory=dict)
    processes: list[ProcessStats] = field(default_factory=list)
    windows: WindowStats = field(default_factory=WindowStats)
    rules: RuleStats = field(default_factory=RuleStats)
    other_files: list[str] = field(default_factory=list)
    source_bytes: int = 0
    run_bytes: int = 0
    seconds: float = 0.0

    @property
    def losses(self) -> list[str]:
        """What could not be imported, one line each (empty when everything was)."""
        out = []
        for n in self.nodes.values():
            if n.corrupt_lines:
                out.append(f"{n.node}: {n.corrupt_lines} system line(s) not JSON with a numeric Value and Timestamp "
                           f"({n.corrupt_last_lines} of them a file's half-written last line)")
            if n.unmapped:
                out.append(f"{n.node}: {sum(n.unmapped.values())} system value(s) of series with no counterpart: "
                           + ", ".join(sorted(n.unmapped)))
            if n.samples_dropped:
                out.append(f"{n.node}: {n.samples_dropped} snapshot(s) could not be written")
        for p in self.processes:
            for kind, s in p.by_file_kind.items():
                bad = {"corrupt lines": s.corrupt_lines, "unreadable files": s.unreadable_files,
                       "begin events never ended": s.unmatched_begin, "end events without a begin": s.unmatched_end,
                       "events ending before they start": s.negative}
                said = ", ".join(f"{v} {k}" for k, v in bad.items() if v)
                if said:
                    out.append(f"{p.process} {kind}: {said}")
            if p.events_dropped:
                out.append(f"{p.process}: {p.events_dropped} event(s) could not be written")
        out += [f"not imported: {s}" for s in self.windows.skipped + self.rules.skipped]
        out += [f"no summary: {s}" for s in self.windows.summary_errors]
        return out

    def to_json(self) -> dict[str, Any]:
        """The `imported` record of run.json: where the run came from and what the import counted."""
        return {
            "from": FROM, "source": self.source, "imported_us": int(time.time() * 1e6),
            "stallwatch": __version__, "seconds": round(self.seconds, 3),
            "source_bytes": self.source_bytes, "run_bytes": self.run_bytes,
            "system": {n: {"files": s.files, "values": s.lines, "values_by_type": dict(s.lines_by_type),
                           "values_stored": s.values_stored, "snapshots": s.snapshots,
                           "unmapped": dict(s.unmapped), "corrupt_lines": s.corrupt_lines,
                           "corrupt_last_lines": s.corrupt_last_lines, "start_us": s.start_us, "end_us": s.end_us,
                           "sample_interval_ms": s.sample_interval_ms} for n, s in self.nodes.items()},
            "framework": [{"process": p.process, "node": p.node, "rank": p.rank, "events": p.events_written,
                           "kinds": dict(p.kinds), "steps": dict(p.steps), "start_us": p.start_us, "end_us": p.end_us,
                           "files": {k: {"files": s.files, "events": s.events, "start_us": s.start_us,
                                         "end_us": s.end_us, "skipped": dict(s.skipped_phases),
                                         "corrupt_lines": s.corrupt_lines, "corrupt_last_lines": s.corrupt_last_lines,
                                         "unmatched_begin": s.unmatched_begin, "unmatched_end": s.unmatched_end,
                                         "unreadable_files": s.unreadable_files}
                                     for k, s in p.by_file_kind.items()}} for p in self.processes],
            "windows": {"detailed": self.windows.detailed, "python": self.windows.python},
            "rules": list(self.rules.imported),
            "not_imported_files": len(self.other_files),
            "losses": self.losses,
        }

    def text(self) -> str:
        """What the command prints."""
        lines = [f"imported {self.source} -> {self.out}  ({self.seconds:.1f} s; "
                 f"{_mb(self.source_bytes)} read, {_mb(self.run_bytes)} stored)"]
        for n, s in self.nodes.items():
            by_type = ", ".join(f"{t or '?'} {c}" for t, c in sorted(s.lines_by_type.items()))
            lines.append(f"  system {n}: {s.lines} values ({by_type}) in {s.files} file(s) -> {s.snapshots} "
                         f"snapshots, every {s.sample_interval_ms or '?'} ms")
        for p in self.processes:
            steps = ", ".join(f"{m} {c}" for m, c in sorted(p.steps.items())) or "none"
            kinds = ", ".join(f"{k} {c}" for k, c in sorted(p.kinds.items()))
            lines.append(f"  framework {p.node}/{p.rank} ({p.process}): {p.events_written} events ({kinds}); "
                         f"steps: {steps}")
        if self.windows.detailed or self.windows.python:
            lines.append(f"  profiling windows: {self.windows.detailed} detailed (TensorFlow), "
                         f"{self.windows.python} Python (cProfile)")
        if self.rules.imported:
            lines.append(f"  rule results (SageMaker's): {', '.join(self.rules.imported)} -> rules/SageMaker.<name>.json")
        if self.other_files:
            shown = ", ".join(self.other_files[:3]) + (" …" if len(self.other_files) > 3 else "")
            lines.append(f"  {len(self.other_files)} file(s) with no counterpart, not imported: {shown}")
        for loss in self.losses:
            lines.append(f"  ! {loss}")
        return "\n".join(lines)


def import_sagemaker(source: str, out: str | None = None, *, runs_dir: str = "stallwatch-runs",
                     progress: Callable[[int, int], None] | None = None) -> ImportSummary:
    """Import `source` into a new run at `out` (default `<runs_dir>/<run id>`); raises SourceError for a bad
    source and store.run_writer.RunExistsError when `out` is not empty. `progress(files_done, files)`."""
    began = time.monotonic()
    src = _open_source(source)
    listing = discover(src, _rule_output_of(source))
    if listing.empty:
        raise SourceError(f"{source} holds no SageMaker Debugger profiler output (no system/…/<time>.<node>.json, "
                          "framework/pevents/…, detailed_profiling/…, python_stats or profiler-reports/…): pass the "
                          "job's profiler output, e.g. s3://BUCKET/JOB/profiler-output")
    first_us = _first_us(listing)
    run_id = layout.new_run_id(datetime.fromtimestamp(first_us / 1e6, timezone.utc)) if first_us else layout.new_run_id()
    out = out or f"{runs_dir.rstrip('/')}/{run_id}"
    run_id = basename(out.rstrip("/")) or run_id
    dest = RunLocation(out)
    summary = ImportSummary(source, out, run_id, other_files=listing.other, source_bytes=listing.source_bytes)
    config = _config(500, out)  # SageMaker's default interval until the data tells
    record = {"format_version": 1, "run_id": run_id, "created_us": first_us or int(time.time() * 1e6),
              "created_by_node": listing.system[0].node if listing.system else None, "command": [],
              "versions": {"python": sys.version.split()[0], "stallwatch": __version__},
              "config": config.to_dict(), "imported": {"from": FROM, "source": source, "complete": False}}
    run_writer.create_run(dest, record, config.to_json())
    budget = StorageBudget(_UNLIMITED)

    total = len(listing.system) + len(listing.traces) + len(listing.tf_traces) + len(listing.stats)
    done = 0

    def advance(n: int = 1) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    for node, files in groupby(listing.system, key=lambda f: f.node):
        importer = NodeSystemImporter(dest, node, budget)
        for f in files:
            importer.read_file(src, f)
            advance()
        summary.nodes[node] = importer.finish()
        logger.info("system %s: %d snapshots", node, summary.nodes[node].snapshots)

    known = sorted(summary.nodes)

    def resolve(host: str | None, process: str) -> str:
        """A host SageMaker did not name (older outputs): the only node there is, else the process's id."""
        if host is not None:
            return host
        return known[0] if len(known) == 1 else node_name(process)

    steps: dict[tuple[str, str], StepIndex] = {}
    for process, pfiles in groupby(listing.traces, key=lambda f: f.process):
        host, rank = split_process(process)
        node = resolve(host, process)
        pfiles = list(pfiles)
        stats = import_process(src, dest, process, node, rank, pfiles, budget)
        advance(len(pfiles))
        summary.processes.append(stats)
        if listing.tf_traces:  # kept only where a window needs its steps
            steps[(node, rank)] = stats.step_index
        stats.step_index = None

    def steps_in(node: str, rank: str, start_us: int, end_us: int) -> tuple[int, int] | None:
        index = steps.get((node, rank))
        return None if index is None else index.train_steps_in(start_us, end_us)

    windows = WindowImporter(src, dest, resolve, steps_in)
    for t in listing.tf_traces:
        windows.tf_trace(t)
        advance()
    for s in listing.stats:
        windows.python_stats(s)
        advance()
    summary.windows = windows.stats
    summary.rules = import_rules(listing.rules, dest)

    measured = sorted(s.sample_interval_ms for s in summary.nodes.values() if s.sample_interval_ms)
    interval = measured[len(measured) // 2] if measured else 500
    config = _config(interval, out)
    record["config"] = config.to_dict()
    run_files.write_config(dest, config)
    for node, rec in _node_records(summary, source, interval).items():
        run_writer.write_node_record(dest, node, rec)
    summary.run_bytes = sum(e.size for e in dest.list(""))
    summary.seconds = time.monotonic() - began
    record["imported"] = {**summary.to_json(), "complete": True}
    run_writer.update_run_record(dest, record)
    return summary


def _node_records(summary: ImportSummary, source: str, interval: int) -> dict[str, dict[str, Any]]:
    ranks: dict[str, list[ProcessStats]] = defaultdict(list)
    for p in summary.processes:
        ranks[p.node].append(p)
    names = sorted(set(summary.nodes) | set(ranks) | summary.windows.nodes)
    out = {}
    for node in names:
        s = summary.nodes.get(node)
        keys = s.keys if s else []
        gpus = sorted({int(k.device[3:]) for k in keys if k.device.startswith("gpu") and k.device[3:].isdigit()})
        cores = {k.device for k in keys if k.device.startswith("cpu") and k.device[3:].isdigit()}
        procs = sorted(ranks.get(node, []), key=lambda p: (int(p.rank) if p.rank.isdigit() else 1 << 40, p.rank))
        starts = [v for v in [s.start_us if s else None, summary.windows.start_us.get(node)]
                  + [p.start_us for p in procs] if v is not None]
        ends = [v for v in [s.end_us if s else None, summary.windows.end_us.get(node)]
                + [p.end_us for p in procs] if v is not None]
        record: dict[str, Any] = {
            "node": node, "hostname": node, "status": "finished",
            "start_us": min(starts) if starts else None, "end_us": max(ends) if ends else None,
            "command": [], "gpus": [{"index": g} for g in gpus],
            "sample_interval_ms": (s.sample_interval_ms if s and s.sample_interval_ms else interval),
            "metrics": [k.column for k in keys],
            "ranks": [{"rank": int(p.rank) if p.rank.isdigit() else p.rank, "pid": p.pid} for p in procs],
            "samples_written": s.snapshots if s else 0, "samples_dropped": s.samples_dropped if s else 0,
            "imported": {"from": FROM, "source": source},
        }
        if cores:  # what SageMaker did not record is left out, not guessed
            record["cpu_cores_logical"] = len(cores)
        if not gpus:
            record["gpu_absent_reason"] = "SageMaker recorded no GPU metrics for this node"
        out[node] = record
    return out


def _open_source(source: str) -> RunLocation:
    try:
        src = RunLocation(source)
    except ValueError as exc:
        raise SourceError(f"{source}: {exc}") from None
    try:
        if not src.remote and not src.local_path().is_dir():
            raise SourceError(f"{source} is not a directory: pass the job's profiler output folder or its s3:// prefix")
        src.list("")
    except SourceError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise SourceError(f"cannot list {source} ({first}); check the path, the bucket and your AWS credentials") \
            from None
    return src


def _rule_output_of(source: str) -> RunLocation | None:
    """SageMaker writes rule reports next to the profiler output: <job>/rule-output/ beside <job>/profiler-output/."""
    base = source.rstrip("/")
    if basename(base) != "profiler-output":
        return None
    sibling = base[: -len("profiler-output")] + "rule-output"
    try:
        loc = RunLocation(sibling)
        if not loc.remote and not loc.local_path().is_dir():
            return None
        return loc
    except Exception:
        return None


def _first_us(listing: Listing) -> int | None:
    times = [f.minute_us for f in listing.system] + [f.time_us for f in listing.traces]
    return min(times) if times else None


def _config(interval_ms: int, out: str) -> ProfilerConfig:
    """The run's configuration: the measured interval (within what a configuration allows)."""
    ms = min(max(int(interval_ms), MIN_SAMPLE_INTERVAL_MS), MAX_SAMPLE_INTERVAL_MS)
    return ProfilerConfig(sample_interval_ms=ms, flush_interval_s=max(5.0, ms / 1000), out=out)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 1024:.1f} KB"
