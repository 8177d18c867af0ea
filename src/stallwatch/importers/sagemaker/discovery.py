"""What a SageMaker Debugger profiler output holds, from its file names alone: system minute files per node,
framework trace files per process, TensorFlow detailed-profiling traces, cProfile/pyinstrument stats and rule
reports. Nothing is read here; every other file is counted as not imported."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from posixpath import basename, dirname

from stallwatch.importers.sagemaker.timestamps import epoch_from_text
from stallwatch.store.location import FileEntry, RunLocation

# <prefix>/system/incremental/<YYYYMMDDHH>/<minute, s>.<node>.json: one file per node and minute
_SYSTEM = re.compile(r"(?:^|/)system/(?:.+/)?(\d{9,})\.([^/]+)\.json$")
# <prefix>/framework/pevents/<YYYYMMDDHH>/<time>_<rank>-<host>_<suffix>
TRACE_SUFFIXES = {
    "pythontimeline.json": "pythontimeline",
    "model_timeline.json": "model_timeline",
    "horovod_timeline.json": "horovod_timeline",
    "smdataparallel_timeline.json": "smdataparallel_timeline",
}
MERGED_SUFFIX = "merged_timeline.json"  # written by SageMaker's own merge tool from the files above: not raw data
_TF_TRACE = re.compile(r"(?:^|/)detailed_profiling/(?:[^/]+/)?(\d+)/plugins/profile/([^/]+)/([^/]+)\.trace\.json\.gz$")
STATS_FILES = {"python_stats": "cprofile", "python_stats.json": "pyinstrument", "python_stats.html": "pyinstrument"}
_RULE_REPORT = re.compile(r"(?:^|/)profiler-reports/([^/]+)\.json$")
_NODE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class SystemFile:
    path: str
    node: str
    minute_us: int
    size: int


@dataclass(frozen=True)
class TraceFile:
    path: str
    kind: str  # pythontimeline, model_timeline, horovod_timeline, smdataparallel_timeline
    process: str  # SageMaker's node id: "<rank or pid>-<host>"
    time_us: int  # from the name: when the file's last event ended
    size: int


@dataclass(frozen=True)
class TfTrace:
    path: str
    step: int  # the first profiled step (the directory's name)
    host: str  # from the trace's file name
    run_dir: str  # plugins/profile/<YYYY_MM_DD_HH_MM_SS>: when the TF profiler wrote it
    metadata: str | None  # <process>_<start us>_<end us>.metadata next to the step directory
    size: int


@dataclass(frozen=True)
class StatsFile:
    path: str
    profiler: str  # cprofile or pyinstrument
    directory: str  # the stats directory's name (its span, steps and, in older outputs, the process)
    process: str | None  # the node id directory above it (newer outputs)
    size: int


@dataclass(frozen=True)
class RuleReport:
    location: RunLocation
    path: str
    name: str
    size: int


@dataclass
class Listing:
    system: list[SystemFile] = field(default_factory=list)
    traces: list[TraceFile] = field(default_factory=list)
    tf_traces: list[TfTrace] = field(default_factory=list)
    stats: list[StatsFile] = field(default_factory=list)
    rules: list[RuleReport] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # files with no counterpart in a run (listed in the summary)
    source_bytes: int = 0

    @property
    def empty(self) -> bool:
        return not (self.system or self.traces or self.tf_traces or self.stats or self.rules)


def node_name(text: str) -> str:
    """A SageMaker host name as a stallwatch node name (letters, digits, '.', '_', '-'; at most 128)."""
    name = _NODE_BAD.sub("-", text).strip(".-")[:128]
    return name or "node"


def split_process(process: str) -> tuple[str | None, str]:
    """SageMaker's node id of a process -> (host, rank): "<rank or pid>-<host>" (e.g. "0-algo-1",
    "905-b88ab1bb8259"); older outputs name a bare number ("0001"): host unknown (None)."""
    head, sep, tail = process.partition("-")
    if sep and head.isdigit() and tail:
        return node_name(tail), str(int(head))
    if process.isdigit():
        return None, str(int(process))
    return node_name(process), "0"


def discover(source: RunLocation, rule_output: RunLocation | None = None) -> Listing:
    """Classify every file under `source` (and the rule reports under `rule_output`, the job's sibling
    `rule-output/` prefix when the source is its `profiler-output/`)."""
    listing = Listing()
    entries = source.list("")
    metadata: dict[str, list[str]] = {}
    for e in entries:
        if e.path.endswith(".metadata"):
            metadata.setdefault(dirname(e.path), []).append(e.path)
    for e in entries:
        listing.source_bytes += e.size
        if not _classify(source, e, listing, metadata):
            listing.other.append(e.path)
    if rule_output is not None:
        for e in rule_output.list(""):
            m = _RULE_REPORT.search(e.path)
            if m:
                listing.rules.append(RuleReport(rule_output, e.path, m.group(1), e.size))
    listing.system.sort(key=lambda f: (f.node, f.minute_us, f.path))
    listing.traces.sort(key=lambda f: (f.process, f.time_us, f.path))
    listing.tf_traces.sort(key=lambda f: f.path)
    listing.stats.sort(key=lambda f: f.path)
    listing.rules.sort(key=lambda f: (f.name, f.path))
    return listing


def _classify(source: RunLocation, e: FileEntry, listing: Listing, metadata: dict[str, list[str]]) -> bool:
    name = basename(e.path)
    m = _SYSTEM.search(e.path)
    if m:
        minute = epoch_from_text(m.group(1))
        if minute is not None:
            listing.system.append(SystemFile(e.path, node_name(m.group(2)), minute, e.size))
            return True
    if "/pevents/" in f"/{e.path}" and name.endswith(".json"):
        kind = next((k for suffix, k in TRACE_SUFFIXES.items() if name.endswith("_" + suffix)), None)
        parts = name.split("_")
        when = epoch_from_text(parts[0]) if len(parts) >= 3 else None
        if kind is not None and when is not None and parts[1]:
            listing.traces.append(TraceFile(e.path, kind, parts[1], when, e.size))
            return True
        return False
    if name.endswith(".metadata") and "detailed_profiling/" in e.path:
        return True  # a TF trace's time base: read with its trace
    m = _TF_TRACE.search(e.path)
    if m:
        step_dir = e.path[:m.start(2)].rstrip("/")  # …/<step>/plugins/profile
        step_dir = dirname(dirname(step_dir))
        meta = sorted(metadata.get(step_dir, []))
        listing.tf_traces.append(TfTrace(e.path, int(m.group(1)), node_name(m.group(3)), m.group(2),
                                         meta[0] if meta else None, e.size))
        return True
    if name in STATS_FILES and "framework/" in f"{e.path}":
        directory = basename(dirname(e.path))
        above = basename(dirname(dirname(e.path)))
        # Newer outputs: framework/<fw>/<profiler>/<process>/<span>/python_stats; older ones put the process
        # inside the span's name: framework/<fw>/cProfile/<start>_<end>_<process>_<step>/python_stats.
        process = above if "-" in directory.split("_", 1)[0] else None
        listing.stats.append(StatsFile(e.path, STATS_FILES[name], directory, process, e.size))
        return True
    m = _RULE_REPORT.search(e.path)
    if m:
        listing.rules.append(RuleReport(source, e.path, m.group(1), e.size))
        return True
    return False
