"""Reading a run: its metadata and its system metrics as tidy Arrow tables, from local disk or S3."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Container, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.log import warn_once
from stallwatch.records import TIMESTAMP, MetricKey, framework_schema, system_schema
from stallwatch.store import framework_codec, layout, profiles_codec, trace_codec
from stallwatch.store.catalog import is_run
from stallwatch.store.listed import ListedLocation
from stallwatch.store.location import FileEntry, RunLocation
from stallwatch.store.node_record import NodeRecord, run_finished
from stallwatch.store.records_check import MAX_TIME_US, NODE_FIELDS, RUN_FIELDS, WINDOW_FIELDS, checked
from stallwatch.store.system_codec import column_span, count_rows, read_columns, read_schema, to_tidy

_LIST_ATTEMPTS = 3  # a live run's parts can be compacted between listing and reading: list again


_READERS = min(4, (os.cpu_count() or 1) + 1)  # threads reading a run's files
_PARALLEL_FROM = 8  # files: fewer are read on the caller's thread
MAX_JSON_BYTES = 16 << 20  # a run's JSON files are kilobytes; a bigger one is not read
# A file's name gives its span (nothing is read to plan a query). A name that cannot be true (before 2000, past
# the year 9999, backwards, or over a week for one file) is checked against the file's data, whose span is used.
MIN_PLAUSIBLE_US = 946_684_800_000_000  # 2000-01-01T00:00:00Z
MAX_NAME_SPAN_US = 7 * 86_400 * 1_000_000
_LONG_CHUNK_US = 86_400 * 1_000_000  # a longer file's time slices come from its data, not from its span


class RunNotFoundError(FileNotFoundError):
    """The location holds no stallwatch run."""


def open_run(uri: str, *, patience_s: float | None = None) -> Run:
    """Open a run directory (`stallwatch-runs/<id>` or `s3://bucket/prefix/<id>`) for reading (`patience_s`: the
    most one request to S3 may take, RunLocation's)."""
    return Run(uri, patience_s=patience_s)


@dataclass
class SystemTail:
    """New system rows since the previous `read()`, for following a live run."""

    run: Run
    nodes: list[str] | None = None
    metrics: list[str] | None = None
    last_us: dict[str, int] = field(default_factory=dict)

    def skip_to_end(self) -> SystemTail:
        """Start after what is stored now: `read()` then returns only rows written from here on."""
        for chunk in self.run._system_chunks(nodes=self.nodes):
            self.last_us[chunk.node] = max(chunk.end_us, self.last_us.get(chunk.node, chunk.end_us))
        return self

    def read(self) -> pa.Table:
        tables = []
        gap: set[str] = set()  # nodes with a file that vanished under us (compacted): read past it next time
        for chunk in self.run._system_chunks(nodes=self.nodes):
            if chunk.node in gap:
                continue
            after = self.last_us.get(chunk.node)
            if after is not None and chunk.end_us <= after:
                continue
            start = None if after is None else after + 1
            t = self.run._load_chunk(chunk, metrics=self.metrics, start_us=start, end_us=None)
            if t is None:
                # Its rows are now in a segment this listing did not see; advancing past newer parts
                # would skip them for good.
                gap.add(chunk.node)
                continue
            if t.num_rows:
                tables.append(t)
                newest = int(pc.max(t.column(TIMESTAMP)).as_py())
                self.last_us[chunk.node] = max(newest, self.last_us.get(chunk.node, newest))
        return _concat(tables)


@dataclass
class SystemOverview:
    node: str
    snapshots: int = 0
    files: int = 0
    bytes: int = 0
    unreadable: int = 0
    start_us: int | None = None
    end_us: int | None = None


class Run:
    """One run directory. Cheap to create; every call lists and reads only what it needs."""

    def __init__(self, uri: str, *, patience_s: float | None = None) -> None:
        self.uri = uri
        self.location = RunLocation(uri, patience_s=patience_s)
        if not is_run(self.location):
            raise RunNotFoundError(
                f"{uri} is not a stallwatch run (no {layout.RUN_JSON} and no {layout.NODES_DIR}/ there); "
                "pass the run directory itself, e.g. stallwatch-runs/<run-id>")

    # -- metadata ---------------------------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        """run.json merged with every node's record; start/end span all nodes (end from data if a node died).
        Every field has its documented type (docs/format.md); one of the wrong type is left out, said once."""
        info = checked(self._read_json(layout.RUN_JSON) or {}, RUN_FIELDS, f"{self.uri}/{layout.RUN_JSON}")
        records = self.node_records()
        info["nodes"] = {name: record.to_json() for name, record in records.items()}
        starts = [r.start_us for r in records.values() if r.start_us is not None]
        ends = [r.last_us for r in records.values() if r.last_us is not None]
        info["start_us"] = min(starts) if starts else info.get("created_us")
        info["end_us"] = max(ends) if ends else None
        return info

    def node_records(self) -> dict[str, NodeRecord]:
        """Each node's record (nodes/<node>.json), typed and checked, by its file's name; a node whose end was
        never written (its machine died) ends, for readers, at its last stored sample (`end_us_from_data`)."""
        records: dict[str, NodeRecord] = {}
        chunks: list[layout.Chunk] | None = None
        for name in self._node_names():
            rel = layout.node_json(name)
            data = self._read_json(rel)
            if data is None:
                continue
            fields = checked(data, NODE_FIELDS, f"{self.uri}/{rel}")
            if fields.get("node", name) != name:
                warn_once(f"node-name-{self.uri}-{rel}", "%s/%s names node %r; it is node %r (its file's name)",
                          self.uri, rel, fields["node"], name)
            fields["node"] = name
            end_from_data = None
            if fields.get("end_us") is None:
                chunks = self._system_chunks() if chunks is None else chunks
                ends = [c.end_us for c in chunks if c.node == name]
                end_from_data = max(ends) if ends else None
            records[name] = NodeRecord.from_json(name, fields, end_from_data)
        return records

    def finished(self) -> bool:
        """Every node of the run has finished (`node_record.run_finished`)."""
        return run_finished(self.node_records().values())

    @property
    def nodes(self) -> list[str]:
        names = {c.node for c in self._system_chunks()}
        names.update(self._node_names())
        return sorted(names)

    def _node_names(self) -> list[str]:
        """Nodes with a record: nodes/<node>.json for a valid node name."""
        names = []
        for entry in self.location.list(layout.NODES_DIR, recursive=False):
            name = entry.path.rsplit("/", 1)[-1][:-5] if entry.path.endswith(".json") else None
            if name is not None and layout.readable_node(name):
                names.append(name)
        return names

    def ranks(self) -> dict[str, list[str]]:
        """Ranks with framework data, per node (empty until framework profiling writes some)."""
        out: dict[str, set[str]] = {}
        for entry in self.location.list(layout.FRAMEWORK_DIR):
            parts = entry.path.split("/")
            if len(parts) >= 4 and layout.readable_node(parts[1]) and layout.rank_number(parts[2]) is not None:
                out.setdefault(parts[1], set()).add(parts[2])
        return {node: sorted(r, key=_rank_key) for node, r in sorted(out.items())}

    def files(self) -> list[FileEntry]:
        return self.location.list("")

    def listed(self, files: list[FileEntry] | None = None) -> "Run":
        """This run answering every listing from one listing of it (`files`, else taken now), renewed only when a
        listed file has gone: for many questions about one state of the run (the dashboard's analysis)."""
        run = Run.__new__(Run)
        run.__dict__.update({k: v for k, v in self.__dict__.items() if not k.startswith("_")})
        run.location = ListedLocation(self.location, self.files() if files is None else files)
        return run

    # -- system metrics ---------------------------------------------------------------------------------
    def system(self, start_us: int | None = None, end_us: int | None = None,
               nodes: Iterable[str] | None = None, metrics: Iterable[str] | None = None) -> pa.Table:
        """Tidy system metrics (timestamp_us, node, device, metric, value) in [start_us, end_us)."""
        metric_list, node_list = _names(metrics), _names(nodes)
        for attempt in range(_LIST_ATTEMPTS):
            tables = []
            for c in self._system_chunks(nodes=node_list):
                if not c.overlaps(start_us, end_us):
                    continue
                t = self._load_chunk(c, metrics=metric_list, start_us=start_us, end_us=end_us)
                if t is None and attempt + 1 < _LIST_ATTEMPTS:
                    break  # compacted since listed: its rows are in a segment the next listing shows
                if t is not None:
                    tables.append(t)
            else:
                return _concat(tables)
        return _concat(tables)

    def system_wide(self, node: str, start_us: int | None = None, end_us: int | None = None,
                    metrics: Iterable[str] | None = None) -> pa.Table:
        """One node's snapshots as stored: a row per snapshot, `timestamp_us` and a float32 column per
        `device/metric` (NaN where no value). A tenth of the tidy table's memory, for long runs."""
        wanted = None if metrics is None else ({metrics} if isinstance(metrics, str) else set(metrics))
        key = None if wanted is None else tuple(sorted(wanted))

        def one(chunk: layout.Chunk) -> pa.Table | None:
            t = self._read_file(chunk, key, lambda: read_columns(self.location.open_input_file(chunk.path),
                                                                 chunk.kind, wanted))
            if t is None:
                return None
            if start_us is not None and chunk.start_us < start_us:  # a filter copies: only where it cuts
                t = t.filter(pc.greater_equal(t[TIMESTAMP], start_us))
            if end_us is not None and chunk.end_us >= end_us:
                t = t.filter(pc.less(t[TIMESTAMP], end_us))
            return t if t.num_rows else None

        chunks = [c for c in self._system_chunks(nodes=[node]) if c.overlaps(start_us, end_us)]
        tables = [t for t in self._map_files(chunks, one) if t is not None]
        if not tables:
            return pa.table({TIMESTAMP: pa.array([], pa.int64())})
        return pa.concat_tables(tables, promote_options="default")

    def time_range(self) -> tuple[int | None, int | None]:
        """Earliest and latest timestamp (µs) of any stored snapshot or framework event, from the file names
        (checked against the data where a name cannot be true); (None, None) for an empty run."""
        chunks = self._system_chunks() + self._chunks(layout.FRAMEWORK_DIR)
        if not chunks:
            return None, None
        return min(c.start_us for c in chunks), max(c.end_us for c in chunks)

    def bytes_per_hour(self) -> float:
        """Stored bytes of system and framework files per hour of the run's span, from the listing (nothing is
        read): how much one time slice of the run holds, whatever the number of nodes and ranks."""
        chunks = self._system_chunks() + self._chunks(layout.FRAMEWORK_DIR)
        if not chunks:
            return 0.0
        span = max(c.end_us for c in chunks) - min(c.start_us for c in chunks)
        return sum(c.size for c in chunks) * 3600e6 / max(span, 1)

    def time_slices(self, slice_us: int, tops: tuple[str, ...] = (layout.SYSTEM_DIR, layout.FRAMEWORK_DIR)
                    ) -> list[tuple[int, int]]:
        """The consecutive [start, end) slices of `slice_us` from the earliest stored time that hold data
        (snapshots by timestamp, events by start), the last one ending just after the latest time. Slices over
        gaps are left out: a year between two files costs nothing, where stepping through it took minutes."""
        chunks = [c for top in tops for c in self._chunks(top)]
        if not chunks:
            return []
        lo, hi = min(c.start_us for c in chunks), max(c.end_us for c in chunks)
        occupied: set[int] = set()
        for c in chunks:
            if c.end_us - c.start_us <= _LONG_CHUNK_US:
                occupied.update(range((c.start_us - lo) // slice_us, (c.end_us - lo) // slice_us + 1))
            else:
                occupied.update(self._occupied(c, lo, slice_us))
        return [(lo + k * slice_us, min(lo + (k + 1) * slice_us, hi + 1)) for k in sorted(occupied)]

    def event_slices(self, slice_us: int) -> list[tuple[int, int]]:
        """`time_slices` of the framework events alone."""
        return self.time_slices(slice_us, tops=(layout.FRAMEWORK_DIR,))

    def _occupied(self, chunk: layout.Chunk, lo: int, slice_us: int) -> set[int]:
        """The slices a long file's rows fall in (read from its time column), all of its span if unreadable."""
        column = "start_us" if chunk.rank is not None else TIMESTAMP
        try:
            if chunk.rank is not None:
                table = framework_codec.read(self.location.open_input_file(chunk.path), chunk.kind, [column])
            else:
                table = read_columns(self.location.open_input_file(chunk.path), chunk.kind, set())
            values = table[column].drop_null().to_numpy()
        except Exception:
            return set(range((chunk.start_us - lo) // slice_us, (chunk.end_us - lo) // slice_us + 1))
        import numpy as np

        return set(np.unique((values - lo) // slice_us).tolist())

    def framework_files(self) -> set[str]:
        """The paths of the framework files stored now (immutable once written; parts vanish when compacted)."""
        return {c.path for c in self._chunks(layout.FRAMEWORK_DIR)}

    # -- framework events -------------------------------------------------------------------------------
    def framework(self, start_us: int | None = None, end_us: int | None = None,
                  kinds: Iterable[str] | None = None, nodes: Iterable[str] | None = None,
                  starting: bool = False, skip_files: Container[str] = (),
                  fields: Iterable[str] | None = None) -> pa.Table:
        """Framework events (steps, data waits, forward, backward, …) overlapping [start_us, end_us) — or,
        with `starting`, that start in it (consecutive ranges then hold each event once) — with node and
        rank, in `framework_schema()` (only node, rank and `fields` when given: the others are not even
        decoded); ordered by node, rank and time. Files in `skip_files` (paths from `framework_files()`) are
        not read: a follower reads only what is new."""
        wanted = None if kinds is None else ({kinds} if isinstance(kinds, str) else set(kinds))
        fields = None if fields is None else ["start_us", *[f for f in fields if f != "start_us"]]
        columns = framework_codec.stored_columns(fields, wanted is not None, start_us is not None or end_us is not None)
        schema = framework_schema() if fields is None else pa.schema(
            [f for f in framework_schema() if f.name in {"node", "rank", *fields}])
        node_set = None if nodes is None else ({nodes} if isinstance(nodes, str) else set(nodes))
        # Chosen, then sorted, and a node's files found by node: sorting (or even looking at) every file of the run
        # for one node's slice made a feed of N nodes cost N² — the rules' time was not linear in the run.
        chunks = [c for c in self._framework_chunks(node_set) if c.rank is not None and c.path not in skip_files
                  and c.overlaps(start_us, end_us)]
        chunks.sort(key=lambda c: (c.node, _rank_key(c.rank or ""), c.start_us))
        key = None if columns is None else tuple(columns)

        def one(chunk: layout.Chunk) -> pa.Table | None:
            stored = self._read_file(chunk, key, lambda: framework_codec.read(
                self.location.open_input_file(chunk.path), chunk.kind, columns))
            if stored is None:
                return None
            assert chunk.rank is not None
            t = framework_codec.to_events(stored, chunk.node, chunk.rank, wanted, start_us, end_us, starting=starting,
                                          fields=fields)
            if not t.num_rows:
                return None
            return t if _in_order(t["start_us"]) else t.take(pc.sort_indices(t["start_us"]))  # usually in order

        tables = [t for t in self._map_files(chunks, one) if t is not None]
        if not tables:
            return schema.empty_table()
        return pa.concat_tables(tables)

    def _framework_chunks(self, nodes: set[str] | None) -> list[layout.Chunk]:
        """The framework files of `nodes` (all: None), in listing order, through an index by node kept with the
        listing it was made from (a pinned run's, read slice by slice)."""
        chunks = self._chunks(layout.FRAMEWORK_DIR)
        if nodes is None:
            return chunks
        index = self.__dict__.get("_framework_index")
        if index is None or index[0] is not chunks:
            by_node: dict[str, list[layout.Chunk]] = {}
            for c in chunks:
                by_node.setdefault(c.node, []).append(c)
            index = self.__dict__["_framework_index"] = (chunks, by_node)
        return [c for node in nodes for c in index[1].get(node, ())]

    # -- profiling windows ------------------------------------------------------------------------------
    def profiles(self, layer: str | None = None) -> list[dict[str, Any]]:
        """The window.json records of complete profiling windows (of `layer`: "detailed" or "python"),
        ordered by node, rank and start; each with `path`, its directory in the run."""
        out = []
        for (node, rank, window), names in self._profile_windows().items():
            rel = layout.trace_window_dir(node, rank, window)
            data = self._read_json(f"{rel}/{layout.WINDOW_JSON}")
            if data is None:
                continue
            record = checked(data, WINDOW_FIELDS, f"{self.uri}/{rel}/{layout.WINDOW_JSON}")
            if record.get("layer") not in layout.PROFILE_LAYERS or "start_us" not in record:
                warn_once(f"bad-window-{self.uri}-{rel}", "skipping window %s/%s: its window.json has no valid "
                          "layer (%s) or start_us", self.uri, rel, ", ".join(layout.PROFILE_LAYERS))
                continue
            if layer is not None and record["layer"] != layer:
                continue
            # Where it is stored is the path's word, not the file's; so are the files it holds.
            out.append({**record, "node": node, "rank": layout.rank_number(rank), "window": window, "path": rel,
                        "stored": sorted(n for n in names if n in layout.CAPTURE_FILES)})
        out.sort(key=lambda r: (str(r.get("node")), _rank_key(str(r.get("rank"))), _int_or(r.get("start_us")),
                                str(r.get("window"))))
        return out

    def open_capture(self, node: str, rank: int, window: str, name: str) -> Any:
        """One stored file of a complete profiling window (a trace, a profile; `layout.CAPTURE_FILES`), to be
        read in blocks. Only what the run's listing holds is opened, and locally never through a link:
        FileNotFoundError for anything else, whatever the names are."""
        names = self._profile_windows().get((node, str(rank), window))
        if name not in layout.CAPTURE_FILES or names is None or name not in names:
            raise FileNotFoundError(f"no capture file {name!r} in window {window!r} of {node}/{rank}")
        return self.location.open_input_file(f"{layout.trace_window_dir(node, rank, window)}/{name}")

    def operators(self, window: str | None = None, nodes: Iterable[str] | None = None) -> pa.Table:
        """Per-operator totals of torch.profiler windows (`operators_schema()`): node, rank, window, name,
        device, calls, self_us, total_us; ordered by node, rank, window, then as stored."""
        return self._summaries(layout.OPERATORS_PARQUET, profiles_codec.OPERATORS_STORED,
                               profiles_codec.operators_schema(), window, nodes)

    def functions(self, window: str | None = None, nodes: Iterable[str] | None = None) -> pa.Table:
        """Per-function totals of Python-profiling windows (`functions_schema()`): node, rank, window,
        function, file, line, calls, self_us, total_us."""
        return self._summaries(layout.FUNCTIONS_PARQUET, profiles_codec.FUNCTIONS_STORED,
                               profiles_codec.functions_schema(), window, nodes)

    def trace_events(self, window_path: str, top: dict[str, Any] | None = None,
                     max_bytes: int = trace_codec.MAX_TRACE_JSON_BYTES) -> Iterator[Any]:
        """The torch.profiler events of a detailed window (`path` of a `profiles()` record), streamed one at a
        time, never loaded whole; its other top-level fields go into `top`. TraceError (a ValueError) for a
        trace that is not one, cut off, or past `max_bytes` of JSON (a 1 MB gzip can hold gigabytes)."""
        with self.location.open_input_file(f"{window_path}/{layout.TRACE_JSON_GZ}") as fh:
            yield from trace_codec.iter_events(fh, top=top, max_bytes=max_bytes)

    def trace_size(self, window_path: str, limit: int = trace_codec.MAX_TRACE_JSON_BYTES) -> int:
        """Bytes of JSON in a detailed window's trace, counted by decompressing it (fast: nothing is parsed),
        up to just past `limit`: check this before streaming a trace that may be a gzip bomb."""
        with self.location.open_input_file(f"{window_path}/{layout.TRACE_JSON_GZ}") as fh:
            return trace_codec.json_size(fh, limit)

    def tail_system(self, nodes: Iterable[str] | None = None, metrics: Iterable[str] | None = None) -> SystemTail:
        """A follower whose `read()` returns only rows newer than what it returned before."""
        return SystemTail(self, _names(nodes), _names(metrics))

    def system_keys(self, node: str) -> list[MetricKey]:
        """The (device, metric) series stored for a node, from the newest file's schema."""
        chunks = [c for c in self._system_chunks(nodes=[node])]
        for chunk in reversed(chunks):
            try:
                schema = read_schema(self.location.open_input_file(chunk.path), chunk.kind)
            except Exception:
                continue
            return [MetricKey.from_column(n) for n in schema.names if n != TIMESTAMP]
        return []

    def system_overview(self) -> dict[str, SystemOverview]:
        """Per node: how many snapshots, over which span, in how many files and bytes (footers only)."""
        out: dict[str, SystemOverview] = {}
        for chunk in self._system_chunks():
            ov = out.setdefault(chunk.node, SystemOverview(chunk.node))
            try:
                ov.snapshots += count_rows(self.location.open_input_file(chunk.path), chunk.kind)
            except Exception:
                ov.unreadable += 1
                continue
            ov.files += 1
            ov.bytes += chunk.size
            ov.start_us = chunk.start_us if ov.start_us is None else min(ov.start_us, chunk.start_us)
            ov.end_us = chunk.end_us if ov.end_us is None else max(ov.end_us, chunk.end_us)
        return out

    # -- internals --------------------------------------------------------------------------------------
    def _profile_windows(self) -> dict[tuple[str, str, str], set[str]]:
        """Complete windows (their window.json is there) -> the names of their files, in path order."""
        found: dict[tuple[str, str, str], set[str]] = {}
        for entry in self.location.list(layout.TRACES_DIR):
            f = layout.parse_window_file(entry.path)
            if f is None:
                continue
            if not (layout.readable_node(f.node) and layout.rank_number(f.rank) is not None
                    and layout.valid_window_name(f.window)):
                warn_once(f"bad-window-{self.uri}-{f.directory}", "skipping %s/%s: not traces/<node>/<rank>/<window> "
                          "(a node name, a rank of 0 … %d, a window name)", self.uri, f.directory, layout.MAX_RANK)
                continue
            found.setdefault((f.node, f.rank, f.window), set()).add(f.name)
        keys = sorted(found, key=lambda k: (k[0], _rank_key(k[1]), k[2]))
        return {k: found[k] for k in keys if layout.WINDOW_JSON in found[k]}

    def _summaries(self, name: str, stored: pa.Schema, schema: pa.Schema, window: str | None,
                   nodes: Iterable[str] | None) -> pa.Table:
        node_set = None if nodes is None else ({nodes} if isinstance(nodes, str) else set(nodes))
        tables = []
        for (node, rank, win), names in self._profile_windows().items():
            if name not in names or (window is not None and win != window) or \
                    (node_set is not None and node not in node_set):
                continue
            rel = f"{layout.trace_window_dir(node, rank, win)}/{name}"
            try:
                t = profiles_codec.decode(self.location.open_input_file(rel), stored)
            except FileNotFoundError:
                continue
            except Exception as exc:
                self._unreadable(rel, exc)
                continue
            if t.num_rows:
                tables.append(profiles_codec.with_window(t, schema, node, rank, win))
        if not tables:
            return schema.empty_table()
        return pa.concat_tables(tables)

    def pinned(self, *, keep_recent: bool = True, node: str | None = None) -> "Run":
        """This run with its file listing taken once and kept: for reading a run in many slices (batch rules)
        without listing the store again for each. Files written after this call are not seen. `keep_recent`:
        keep each stream's last file read (consecutive slices of one node); a reader of every node at once
        leaves it out, since that would hold a file of every stream of the run. `node`: only that node's files
        are listed (and seen): a reader of one node of many lists its own folders, not the whole run."""
        run = Run.__new__(Run)
        run.__dict__.update(self.__dict__)
        run.__dict__["_listing"] = {top: self._list_chunks(top, node)
                                    for top in (layout.SYSTEM_DIR, layout.FRAMEWORK_DIR)}
        run.__dict__.pop("_recent", None)
        if keep_recent:
            run.__dict__["_recent"] = {}  # stream -> ((path, columns), table): see _read_file
        return run

    def pinned_by_node(self) -> dict[str, "Run"]:
        """`pinned()` once, as one view per node that lists only that node's files, keeping no file between reads:
        for many small reads of any node (a replay by step numbers), each of which would otherwise sort and filter
        every file of the run, and a kept file per stream would be one of every stream of the run."""
        run = self.pinned(keep_recent=False)
        listing = run.__dict__["_listing"]
        views = {}
        for node in sorted({c.node for chunks in listing.values() for c in chunks}):
            view = Run.__new__(Run)
            view.__dict__.update(run.__dict__)
            view.__dict__["_listing"] = {top: [c for c in chunks if c.node == node] for top, chunks in listing.items()}
            views[node] = view
        return views

    def forget_recent(self) -> None:
        """Drop the files a pinned run keeps for consecutive slices (moving on to another node's streams)."""
        recent = self.__dict__.get("_recent")
        if recent is not None:
            recent.clear()

    def vanished_files(self) -> int:
        """How many listed files had gone when they were read (parts compacted into a segment meanwhile). A
        pinned run does not see the new segment: its reader re-pins and reads again when this grows."""
        return int(self.__dict__.get("_vanished", 0))

    def _unreadable(self, rel: str, exc: BaseException) -> None:
        """A damaged file (a checksum that fails, a cut or garbled file): said once and counted, its rows lost."""
        warn_once(f"bad-file-{self.uri}-{rel}", "skipping unreadable file %s/%s (%s)", self.uri, rel, _first_line(exc))
        self.__dict__.setdefault("_unreadable_files", set()).add(rel)

    @property
    def unreadable_files(self) -> list[str]:
        """The run's files that could not be read so far (damaged): what they held is missing from every answer."""
        return sorted(self.__dict__.get("_unreadable_files", ()))

    def _read_file(self, chunk: layout.Chunk, key: Any, read: Any) -> pa.Table | None:
        """One stored file's table; None when it vanished (compacted since it was listed: its rows are in the
        segment listed next time) or cannot be read (said once). A pinned run keeps the last file read of each
        stream: read in consecutive time slices, the file that straddles two slices is decoded once."""
        recent = self.__dict__.get("_recent")
        hit = None if recent is None else recent.get(chunk.stream)
        if hit is not None and hit[0] == (chunk.path, key):
            return hit[1]
        try:
            table = read()
        except FileNotFoundError:  # compacted since it was listed: its rows are in a segment listed later
            self.__dict__["_vanished"] = self.__dict__.get("_vanished", 0) + 1
            return None
        except Exception as exc:
            self._unreadable(chunk.path, exc)
            return None
        if recent is not None:
            recent[chunk.stream] = ((chunk.path, key), table)
        return table

    def _map_files(self, chunks: list[layout.Chunk], one: Any) -> list[Any]:
        """`one(chunk)` for each chunk, in order. Many files are read on a few threads (Parquet decoding
        releases the GIL); a pinned run reads in order on the caller's thread (it already reads ahead)."""
        if len(chunks) < _PARALLEL_FROM or "_recent" in self.__dict__:
            return [one(c) for c in chunks]
        with ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="stallwatch-read") as pool:
            return list(pool.map(one, chunks))

    def _chunks(self, top: str) -> list[layout.Chunk]:
        listing = self.__dict__.get("_listing")
        if listing is not None and top in listing:
            return listing[top]
        if isinstance(self.location, ListedLocation):
            return self.location.derived(f"chunks:{top}", lambda: self._list_chunks(top))
        return self._list_chunks(top)

    def _list_chunks(self, top: str, node: str | None = None) -> list[layout.Chunk]:
        chunks: list[layout.Chunk] = []
        if node is not None and not layout.readable_node(node):
            return chunks
        for e in self.location.list(top if node is None else f"{top}/{node}"):
            c = layout.parse_chunk(e.path, e.size)
            if c is not None and (node is None or c.node == node) and (c := self._checked_chunk(top, c)) is not None:
                chunks.append(c)
        return layout.live_chunks(chunks)

    def _checked_chunk(self, top: str, c: layout.Chunk) -> layout.Chunk | None:
        """The chunk if its path is one the writers make (a node name; a rank of 0 … 2**31-1), with a span
        its data bears out; None (said once) for anything else."""
        depth = 4 if top == layout.FRAMEWORK_DIR else 3
        if (c.path.count("/") != depth - 1 or not layout.readable_node(c.node)
                or (top == layout.FRAMEWORK_DIR and (c.rank is None or layout.rank_number(c.rank) is None))):
            warn_once(f"bad-path-{self.uri}-{c.stream}", "skipping %s/%s: not %s/<node>%s/<file> (a node name "
                      "of printable characters; ranks 0 … %d)", self.uri, c.stream, top,
                      "/<rank>" if top == layout.FRAMEWORK_DIR else "", layout.MAX_RANK)
            return None
        if MIN_PLAUSIBLE_US <= c.start_us <= c.end_us < MAX_TIME_US and c.end_us - c.start_us <= MAX_NAME_SPAN_US:
            return c
        key = (c.path, c.size)
        spans = self.__dict__.setdefault("_spans", {})
        if key not in spans:
            spans[key] = self._data_span(c)
            if spans[key] is not None:
                warn_once(f"name-span-{self.uri}-{c.path}", "%s/%s: its name's times do not match its data; the "
                          "data's span is used", self.uri, c.path)
        span = spans[key]
        return None if span is None else dataclasses.replace(c, start_us=span[0], end_us=span[1])

    def _data_span(self, c: layout.Chunk) -> tuple[int, int] | None:
        low, high = ("start_us", "end_us") if c.rank is not None else (TIMESTAMP, TIMESTAMP)
        try:
            span = column_span(self.location.open_input_file(c.path), c.kind, low, high)
        except FileNotFoundError:
            return None
        except Exception as exc:
            self._unreadable(c.path, exc)
            return None
        if span is None or not (0 <= span[0] <= span[1] < MAX_TIME_US):
            warn_once(f"bad-span-{self.uri}-{c.path}", "skipping %s/%s: it holds no rows with times in range",
                      self.uri, c.path)
            return None
        return span

    def _system_chunks(self, nodes: Iterable[str] | None = None) -> list[layout.Chunk]:
        wanted = None if nodes is None else set(nodes)
        return [c for c in self._chunks(layout.SYSTEM_DIR) if wanted is None or c.node in wanted]

    def _read_chunk(self, chunk: layout.Chunk, *, metrics: list[str] | None,
                    start_us: int | None, end_us: int | None) -> pa.Table:
        t = self._load_chunk(chunk, metrics=metrics, start_us=start_us, end_us=end_us)
        return system_schema().empty_table() if t is None else t

    def _load_chunk(self, chunk: layout.Chunk, *, metrics: list[str] | None,
                    start_us: int | None, end_us: int | None) -> pa.Table | None:
        """The chunk's tidy rows; None when the file vanished (compacted since it was listed)."""
        try:
            source = self.location.open_input_file(chunk.path)
            table = read_columns(source, chunk.kind, None if metrics is None else set(metrics))
        except Exception as exc:  # truncated, corrupt or vanished (compacted) file
            if isinstance(exc, FileNotFoundError):
                return None
            self._unreadable(chunk.path, exc)
            return system_schema().empty_table()
        return to_tidy(table, chunk.node, None if metrics is None else set(metrics), start_us, end_us)

    def _read_json(self, rel: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.location.read(rel, MAX_JSON_BYTES))
        except FileNotFoundError:
            return None
        except Exception as exc:
            warn_once(f"bad-json-{self.uri}-{rel}", "skipping unreadable %s/%s (%s)", self.uri, rel, exc)
            return None
        if not isinstance(data, dict):
            warn_once(f"bad-json-{self.uri}-{rel}", "skipping %s/%s (a JSON object was expected, not %s)",
                      self.uri, rel, type(data).__name__)
            return None
        return data

    def __repr__(self) -> str:
        return f"Run({self.uri!r})"


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _in_order(column: pa.ChunkedArray) -> bool:
    """No nulls and never decreasing: a stable sort would leave it as it is."""
    if column.null_count:
        return False
    values = column.to_numpy()
    return bool((values[1:] >= values[:-1]).all())


def _names(names: Iterable[str] | str | None) -> list[str] | None:
    """A filter of names; one name given as a plain string means that name, not its characters."""
    if names is None:
        return None
    return [names] if isinstance(names, str) else list(names)


def _concat(tables: list[pa.Table]) -> pa.Table:
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return system_schema().empty_table()
    return pa.concat_tables(tables)


def _int_or(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _rank_key(rank: str) -> tuple[int, str]:
    return (int(rank), rank) if rank.isdigit() else (1 << 30, rank)
