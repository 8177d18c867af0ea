"""Reading a run's rollups: the stored files where they cover the data, rebuilt from the segments where they do
not (runs from before rollups, imported runs, a damaged or missing file) and cached back into the run when it is
writable and finished — in memory otherwise (a read-only bucket never fails a read). The open tail of a live
stream (its parts) is rolled up on each read."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.log import logger, warn_once
from stallwatch.records import TIMESTAMP
from stallwatch.store import framework_codec, layout
from stallwatch.store.rollup_codec import (
    FRAMEWORK_SCHEMA,
    RollupError,
    combine_framework,
    combine_system,
    decode_framework,
    decode_system,
    encode,
    framework_rows,
    system_columns,
    system_rows,
)
from stallwatch.store.system_codec import read_columns

_READERS = 4  # threads reading a run's per-rank rollup files
_EVENT_COLUMNS = ["kind", "name", "mode", "step", "start_us", "end_us", "args"]


@dataclass(frozen=True)
class RollupFile:
    path: str
    start_us: int
    end_us: int


@dataclass(frozen=True)
class StreamRollup:
    """One stream's rollup rows and where they came from (files read, segments rolled up now)."""
    rows: pa.Table
    files: int
    rebuilt: int


class RunRollups:
    """The rollups of one `Run` (store.reader): per node (system) and per rank (framework). Thread-safe; decoded
    files and rebuilt segments are kept for the life of the object (files are immutable by name)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self._lock = threading.Lock()
        self._files: dict[tuple[str, Hashable], pa.Table | None] = {}  # (file, view): decoded
        self._rebuilt: dict[str, pa.Table] = {}  # segments without rollups: rolled up once
        self._read_only_said = False
        self._statuses: dict[str, bool] | None = None  # node: finished

    # -- system ----------------------------------------------------------------------------------------------
    def system(self, node: str, level_us: int, metrics: frozenset[str] | None = None) -> StreamRollup:
        """The node's system rollup at `level_us` (one of rollup_codec.SYSTEM_LEVELS_US), over all its data; only
        the series of `metrics` when given (an empty set: the buckets' counts and gaps alone)."""
        chunks = self.run._system_chunks(nodes=[node])

        def rebuild(chunk: layout.Chunk) -> pa.Table:
            wide = read_columns(self.run.location.open_input_file(chunk.path), chunk.kind, None)
            names = [c for c in wide.column_names if c != TIMESTAMP]
            ts = wide[TIMESTAMP].to_numpy()
            values = np.column_stack([wide[c].to_numpy(zero_copy_only=False) for c in names]) if names \
                else np.empty((len(ts), 0))
            return system_rows(ts, values, names)

        return self._stream(layout.system_rollup_dir(node), chunks, (level_us, metrics), rebuild,
                            lambda src: decode_system(src, level_us, metrics), combine_system,
                            finished=self._finished(node), level_of=lambda t: _projected(_level(t, level_us), metrics))

    # -- framework -------------------------------------------------------------------------------------------
    def framework(self, nodes: list[str] | None = None) -> pa.Table:
        """Every rank's framework rollup rows (FRAMEWORK_SCHEMA plus node and rank), ordered by node and rank."""
        by_stream: dict[tuple[str, str], list[layout.Chunk]] = {}
        for c in self.run._chunks(layout.FRAMEWORK_DIR):
            if c.rank is not None and (nodes is None or c.node in nodes):
                by_stream.setdefault((c.node, c.rank), []).append(c)
        for node in nodes if nodes is not None else self.run.nodes:  # ranks with rollups but no events left
            for rank in self._rollup_ranks(node):
                by_stream.setdefault((node, rank), [])
        def one(stream: tuple[tuple[str, str], list[layout.Chunk]]) -> pa.Table:
            (node, rank), chunks = stream

            def rebuild(chunk: layout.Chunk) -> pa.Table:
                stored = framework_codec.read(self.run.location.open_input_file(chunk.path), chunk.kind,
                                              _EVENT_COLUMNS)
                return framework_rows(stored)

            rows = self._stream(layout.framework_rollup_dir(node, rank), chunks, None, rebuild, decode_framework,
                                combine_framework, finished=self._finished(node), level_of=lambda t: t).rows
            n = rows.num_rows
            rank_no = layout.rank_number(rank)
            return rows.append_column("node", pa.array([node] * n, pa.string())) \
                .append_column("rank", pa.array([rank_no if rank_no is not None else -1] * n, pa.int32()))

        streams = sorted(by_stream.items(), key=lambda kv: (kv[0][0], _rank_key(kv[0][1])))
        with ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="stallwatch-rollups") as pool:
            tables = list(pool.map(one, streams))  # a file per rank: Parquet decodes without the GIL
        if not tables:
            return pa.schema([*FRAMEWORK_SCHEMA, pa.field("node", pa.string()), pa.field("rank", pa.int32())]
                             ).empty_table()
        return pa.concat_tables(tables)

    def _rollup_ranks(self, node: str) -> list[str]:
        out = set()
        for e in self.run.location.list(f"{layout.ROLLUPS_DIR}/{layout.FRAMEWORK_DIR}/{node}"):
            parts = e.path.split("/")
            if len(parts) == 5 and layout.rank_number(parts[3]) is not None:
                out.add(parts[3])
        return sorted(out, key=_rank_key)

    # -- one stream ------------------------------------------------------------------------------------------
    def _stream(self, directory: str, chunks: list[layout.Chunk], view: Hashable,
                rebuild: Callable[[layout.Chunk], pa.Table], decode: Callable[[Any], pa.Table],
                combine: Callable[[list[pa.Table]], pa.Table], *, finished: bool,
                level_of: Callable[[pa.Table], pa.Table]) -> StreamRollup:
        files = self._list(directory)
        tables, covered = [], []
        for f in files:
            t = self._decoded(f, view, decode)
            if t is not None:
                tables.append(t)
                covered.append((f.start_us, f.end_us))
        spans = _merged(covered)
        missing = [c for c in chunks if not any(lo <= c.start_us and c.end_us <= hi for lo, hi in spans)]
        segments = [c for c in missing if c.kind == layout.SEGMENT]
        rebuilt = 0
        if segments:  # rebuilt once whatever the view asked: every level and series, then the view taken
            key = directory + "|" + ",".join(c.path for c in segments)
            with self._lock:
                whole = self._rebuilt.get(key)
            if whole is None:
                whole = self._rebuild(segments, rebuild, combine)
                rebuilt = len(segments)
                if whole is not None:
                    if finished:
                        self._save(directory, segments, whole)
                    with self._lock:
                        self._rebuilt[key] = whole
            if whole is not None:
                tables.append(level_of(whole))
        tails = [c for c in missing if c.kind != layout.SEGMENT]
        if tails:  # a live stream's open segment: small, and changing
            tail = self._rebuild(tails, rebuild, combine)
            if tail is not None:
                tables.append(level_of(tail))
        return StreamRollup(combine(tables), len(tables), rebuilt)

    def _list(self, directory: str) -> list[RollupFile]:
        """The stream's rollup files; of files with one start (a block rewritten as it grew, and a crash before
        the older one was deleted) only the latest end."""
        best: dict[int, RollupFile] = {}
        for e in self.run.location.list(directory, recursive=False):
            span = layout.parse_rollup_name(e.path.rsplit("/", 1)[-1])
            if span is None or span[0] > span[1]:
                continue
            if span[0] not in best or best[span[0]].end_us < span[1]:
                best[span[0]] = RollupFile(e.path, *span)
        kept: list[RollupFile] = []
        for f in sorted(best.values(), key=lambda f: (f.start_us, -f.end_us)):
            holder = next((k for k in kept if k.start_us <= f.start_us and f.end_us <= k.end_us), None)
            if holder is not None:  # a copy: counting it too doubled every figure read from the rollups
                warn_once(f"dup-rollup-{self.run.uri}-{f.path}", "skipping rollup %s/%s: its span lies inside %s's "
                          "(a copy or a stray file)", self.run.uri, f.path, holder.path.rsplit("/", 1)[-1])
                continue
            kept.append(f)
        return kept

    def _decoded(self, f: RollupFile, view: Hashable, decode: Callable[[Any], pa.Table]) -> pa.Table | None:
        key = (f.path, view)
        with self._lock:
            if key in self._files:
                return self._files[key]
        try:
            table: pa.Table | None = _within_span(decode(self.run.location.open_input_file(f.path)), f)
        except FileNotFoundError:  # replaced by a longer one since listed: the next read sees it
            return None
        except (RollupError, OSError) as exc:
            warn_once(f"bad-rollup-{self.run.uri}-{f.path}", "skipping rollup %s/%s (%s); rebuilt from the data",
                      self.run.uri, f.path, exc)
            table = None
        with self._lock:
            self._files[key] = table
        return table

    def _rebuild(self, chunks: list[layout.Chunk], rebuild: Callable[[layout.Chunk], pa.Table],
                 combine: Callable[[list[pa.Table]], pa.Table]) -> pa.Table | None:
        tables = []
        for c in chunks:
            try:
                tables.append(rebuild(c))
            except FileNotFoundError:
                continue
            except Exception as exc:  # the data file itself is bad: the readers say so once too
                warn_once(f"bad-file-{self.run.uri}-{c.path}", "skipping unreadable file %s/%s (%s)", self.run.uri,
                          c.path, type(exc).__name__)
        return combine(tables) if tables else None

    def _save(self, directory: str, segments: list[layout.Chunk], rows: pa.Table) -> None:
        """Cache rebuilt rollups in the run (one file over the segments' span); a read-only run keeps them in
        memory, said once."""
        name = f"{directory}/{layout.rollup_name(min(c.start_us for c in segments), max(c.end_us for c in segments))}"
        try:
            self.run.location.write_atomic(name, encode(rows))
        except Exception as exc:
            if not self._read_only_said:
                self._read_only_said = True
                logger.info("rollups of %s kept in memory: cannot write them into the run (%s)", self.run.uri,
                            str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__)

    def _finished(self, node: str) -> bool:
        """A node whose record says it ended (no writer will add rollups for these segments)."""
        if self._statuses is None:
            self._statuses = {n: r.finished for n, r in self.run.node_records().items()}
        return self._statuses.get(node, False)


def _within_span(table: pa.Table, f: RollupFile) -> pa.Table:
    """The decoded rows, or RollupError when any lies outside the span the file's name gives (a file of another
    run or node put here: its rows would be counted as this stream's)."""
    if table.num_rows and "first_us" in table.column_names and "last_us" in table.column_names:
        lo, hi = pc.min(table["first_us"]).as_py(), pc.max(table["last_us"]).as_py()
        if lo is not None and hi is not None and (lo < f.start_us or hi > f.end_us):
            raise RollupError(f"its rows ({lo}..{hi}) lie outside the span its name gives: not this stream's")
    return table


def _level(table: pa.Table, level: int) -> pa.Table:
    import pyarrow.compute as pc

    return table.filter(pc.equal(table["level_us"], level)) if table.num_rows else table


def _projected(table: pa.Table, metrics: frozenset[str] | None) -> pa.Table:
    """The table with the bucket columns and only the series of `metrics` (all of them for None)."""
    if metrics is None:
        return table
    return table.select(system_columns(table.column_names, metrics))


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive spans joined where they touch or overlap."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _rank_key(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 62, rank)
