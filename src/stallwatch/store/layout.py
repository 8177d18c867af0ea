"""Names of everything in a run directory; the one place that knows the layout (docs/format.md mirrors it)."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

RUN_JSON = "run.json"
CONFIG_JSON = "config.json"
NODES_DIR = "nodes"
SYSTEM_DIR = "system"
FRAMEWORK_DIR = "framework"
TRACES_DIR = "traces"
RULES_DIR = "rules"
ESCALATIONS_DIR = "escalations"  # one JSON record per automatic capture a firing rule asked for
REPORT_HTML = "report.html"
ROLLUPS_DIR = "rollups"  # rollups/system/<node>/, rollups/framework/<node>/<rank>/: per-bucket summaries
LIVE_DIR = "live"  # live/<node>.json: the node's sampler's running counts, rewritten every second (store/live_status)

# One flush: written every few seconds so a crash loses at most one interval. Arrow IPC, because a
# part lives only until its segment is written and Parquet's encoding would cost ~10 ms per flush.
PART = "part"
# One rotation period, compacted from its parts into Parquet; the parts are deleted afterwards.
SEGMENT = "seg"
EXTENSIONS = {PART: "arrow", SEGMENT: "parquet"}
_CHUNK = re.compile(r"^(part|seg)-(\d{16,})-(\d{16,})\.(arrow|parquet)$")


def new_run_id(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def plain_name(text: object) -> str | None:
    """`text` when it is one plain path segment (letters, digits, '.', '_', '-', not starting with a dot, at
    most 128 characters), else None: names read from a run (its id) may go into a file name, nothing else."""
    return text if isinstance(text, str) and _PLAIN_NAME.match(text) else None


def readable_node(name: object) -> bool:
    """A node directory or record name a reader takes: one printable path segment (what the writers make is
    stricter, see ProfilerConfig.node; an odd name read from a run is only data, and renderers escape it)."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and name not in (".", "..") and name.isprintable()
            and "/" not in name)


MAX_RANK = 2**31 - 1  # ranks are stored as int32


def rank_number(rank: str) -> int | None:
    """A rank directory's number (0 … 2**31-1), or None for a name that is not one (a crafted
    `framework/n/4294967296/` must not reach an int32 column)."""
    if not (isinstance(rank, str) and rank.isdigit() and rank.isascii() and len(rank) <= 10):
        return None
    value = int(rank)
    return value if value <= MAX_RANK else None


def node_json(node: str) -> str:
    return f"{NODES_DIR}/{node}.json"


def live_json(node: str) -> str:
    return f"{LIVE_DIR}/{node}.json"


def framework_dir(node: str, rank: int | str) -> str:
    return f"{FRAMEWORK_DIR}/{node}/{rank}"


def system_dir(node: str) -> str:
    return f"{SYSTEM_DIR}/{node}"


def system_rollup_dir(node: str) -> str:
    return f"{ROLLUPS_DIR}/{SYSTEM_DIR}/{node}"


def framework_rollup_dir(node: str, rank: int | str) -> str:
    return f"{ROLLUPS_DIR}/{FRAMEWORK_DIR}/{node}/{rank}"


_ROLLUP = re.compile(r"^roll-(\d{16,})-(\d{16,})\.parquet$")


def rollup_name(start_us: int, end_us: int) -> str:
    """A rollup file covers the stream's samples (events) from start_us to end_us, both included."""
    return f"roll-{start_us:016d}-{end_us:016d}.parquet"


def parse_rollup_name(name: str) -> tuple[int, int] | None:
    m = _ROLLUP.match(name)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def chunk_name(kind: str, start_us: int, end_us: int) -> str:
    """Time-ordered, fixed-width names: listing order is time order and a time range picks files by name."""
    return f"{kind}-{start_us:016d}-{end_us:016d}.{EXTENSIONS[kind]}"


@dataclass(frozen=True)
class Chunk:
    path: str
    node: str
    kind: str
    start_us: int
    end_us: int
    size: int
    rank: str | None = None  # framework streams only

    @property
    def stream(self) -> str:
        """The directory this chunk belongs to: parts and segments are matched within one stream."""
        return self.path.rsplit("/", 1)[0]

    def overlaps(self, start_us: int | None, end_us: int | None) -> bool:
        return (start_us is None or self.end_us >= start_us) and (end_us is None or self.start_us < end_us)


def parse_chunk(path: str, size: int = 0) -> Chunk | None:
    parts = path.split("/")
    if len(parts) < 3:
        return None
    m = _CHUNK.match(parts[-1])
    if not m:
        return None
    if parts[0] == FRAMEWORK_DIR and len(parts) == 4:
        node, rank = parts[1], parts[2]
    else:
        node, rank = parts[-2], None
    return Chunk(path, node, m.group(1), int(m.group(2)), int(m.group(3)), size, rank)


def live_chunks(chunks: list[Chunk]) -> list[Chunk]:
    """Drop parts already compacted into a segment (a crash between writing a segment and deleting its
    parts leaves both); the result holds every row exactly once, sorted by stream and time."""
    segments: dict[str, list[Chunk]] = {}
    for c in chunks:
        if c.kind == SEGMENT:
            segments.setdefault(c.stream, []).append(c)
    keyed = []
    for c in chunks:
        stream = c.stream
        if c.kind == PART and any(s.start_us <= c.start_us and c.end_us <= s.end_us for s in segments.get(stream, ())):
            continue
        keyed.append(((stream, c.start_us, c.kind != SEGMENT), c))
    keyed.sort(key=lambda kc: kc[0])  # each chunk's stream taken once: tens of thousands of files in a long run
    return [c for _, c in keyed]


# -- profiling windows: traces/<node>/<rank>/<window>/ -------------------------------------------------------
# One directory per profiling window of one rank; window.json is written last, so its presence means the
# window is complete (a reader ignores directories without it).
WINDOW_JSON = "window.json"
TRACE_JSON_GZ = "trace.json.gz"  # torch.profiler Chrome trace, gzipped (Perfetto and HTA open it as is)
OPERATORS_PARQUET = "operators.parquet"  # per (operator, device) totals from the trace
MEMORY_SITES_JSON = "memory_sites.json"  # a memory capture's top allocation sites (tracemalloc diff)
CUDA_MEMORY_PICKLE = "cuda_memory.pickle"  # torch.cuda.memory._dump_snapshot: pytorch.org/memory_viz opens it
PSTATS = "profile.pstats"  # cProfile dump_stats output, as written
PYINSTRUMENT_JSON = "pyinstrument.json"  # pyinstrument session (Session.load reads it back)
PYINSTRUMENT_HTML = "pyinstrument.html"  # pyinstrument's interactive page for that session
FUNCTIONS_PARQUET = "functions.parquet"  # per-function totals from cProfile or pyinstrument
PROFILE_LAYERS = ("detailed", "python", "memory")  # memory: where memory grows (issue 38)
# The files of a window that are the capture itself (what a user downloads); the rest are summaries of them.
CAPTURE_FILES = (TRACE_JSON_GZ, PSTATS, PYINSTRUMENT_JSON, PYINSTRUMENT_HTML, MEMORY_SITES_JSON, CUDA_MEMORY_PICKLE)
_WINDOW = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")


def valid_window_name(window: str) -> bool:
    """A window is one path segment: letters, digits, '.', '_', '-', not hidden, at most 128 characters."""
    return isinstance(window, str) and bool(_WINDOW.match(window))


def window_name(layer: str, start_us: int) -> str:
    """What the job names a window: layer and start, fixed width so name order is time order."""
    return f"{layer}-{start_us:016d}"


def trace_window_dir(node: str, rank: int | str, window: str) -> str:
    return f"{TRACES_DIR}/{node}/{rank}/{window}"


@dataclass(frozen=True)
class WindowFile:
    """One file inside a profiling window's directory, parsed from its path."""

    node: str
    rank: str
    window: str
    name: str

    @property
    def directory(self) -> str:
        return trace_window_dir(self.node, self.rank, self.window)


def parse_window_file(path: str) -> WindowFile | None:
    """`traces/<node>/<rank>/<window>/<name>` -> its parts; None for anything else under traces/."""
    parts = path.split("/")
    if len(parts) != 5 or parts[0] != TRACES_DIR:
        return None
    return WindowFile(parts[1], parts[2], parts[3], parts[4])
