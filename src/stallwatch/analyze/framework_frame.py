"""The framework frame: a chunk's framework events as numpy columns (names coded once), derived once per chunk
and shared by every rule and analysis that reads steps and phases."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze.frames import Chunk
from stallwatch.records import DATA_WAIT, MODES


def text_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """A (dictionary) string column as integer codes and the values they stand for (in order of first
    appearance in the chunks' dictionaries; codes of one table only, never compared across tables)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    values: dict[str, int] = {}
    out = np.empty(sum(len(c) for c in chunks), np.int64)  # filled chunk by chunk: no list of parts to join
    at = 0
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk.cast(pa.string()))
        mapping = np.array([values.setdefault(str(v), len(values)) for v in chunk.dictionary.to_pylist()], np.int64)
        part = out[at:at + len(chunk)]
        if mapping.size:
            indices = chunk.indices if chunk.indices.null_count == 0 else pc.fill_null(chunk.indices, 0)
            np.take(mapping, indices.to_numpy(zero_copy_only=False), out=part)
        else:
            part[:] = 0
        at += len(chunk)
    return out, list(values)


def int_column(column: pa.ChunkedArray | pa.Array, null: int = -1) -> np.ndarray:
    if column.null_count:
        column = pc.fill_null(column, null)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


class FrameworkColumns:
    """The columns of a framework-event table (`framework_schema()`) as numpy arrays: text columns as codes
    into `nodes`, `kinds`, `modes`; `step` is -1 where null."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.n = table.num_rows
        self.node, self.nodes = text_codes(table["node"])
        self.kind, self.kinds = text_codes(table["kind"])
        self.mode, self.modes = text_codes(table["mode"])
        self.rank = int_column(table["rank"])
        self.step = int_column(table["step"])
        self.start = int_column(table["start_us"])
        self.end = int_column(table["end_us"])
        self._codes: np.ndarray | None | bool = False  # groups()'s per-row group numbers, made on first use
        self._ranks = np.empty(0, np.int64)

    def kind_is(self, *kinds: str) -> np.ndarray:
        return _lookup(self.kinds, set(kinds), self.kind, self.n)

    def mode_is(self, modes: Iterable[str]) -> np.ndarray:
        return _lookup(self.modes, set(modes), self.mode, self.n)

    def groups(self, mask: np.ndarray, *, by_mode: bool = True) -> list[tuple[tuple, np.ndarray]]:
        """Rows under `mask` grouped by (node, rank[, mode]): [(key, row indices in table order)], in key
        order (node code, rank, mode code)."""
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return []
        codes = self._group_codes()
        if codes is None:
            return self._groups_sorted(idx, by_mode)
        ranks, nm = self._ranks, max(len(self.modes), 1)
        key = codes[idx] if by_mode else codes[idx] // np.uint16(nm)
        counts = np.bincount(key)
        uniq = np.flatnonzero(counts)
        order = np.argsort(key, kind="stable")  # uint16: a radix sort, table order within a group
        bounds = np.concatenate([[0], np.cumsum(counts[uniq])])
        return self._named(uniq.tolist(), ranks, nm, by_mode, idx, order, bounds)

    def _group_codes(self) -> np.ndarray | None:
        """Per row, (node, rank, mode) as one small number (uint16) ordered like the triple, computed once;
        None when they do not fit (ranks spread too wide, too many groups)."""
        if self._codes is False:
            if self.n == 0:
                self._codes = None
                return None
            lo, hi = int(self.rank.min()), int(self.rank.max())
            self._codes = None
            if hi - lo <= _DENSE_RANKS:
                present = np.flatnonzero(np.bincount(self.rank - lo))
                nm, nr = max(len(self.modes), 1), len(present)
                if max(len(self.nodes), 1) * nr * nm < 1 << 16:
                    dense = np.zeros(hi - lo + 1, np.uint16)
                    dense[present] = np.arange(nr)
                    self._ranks = present + lo
                    self._codes = ((self.node.astype(np.uint16) * np.uint16(nr) + dense[self.rank - lo])
                                   * np.uint16(nm) + self.mode.astype(np.uint16))
        return self._codes

    def _groups_sorted(self, idx: np.ndarray, by_mode: bool) -> list[tuple[tuple, np.ndarray]]:
        """groups() for ranks or keys too spread out for counting: unique keys and a stable argsort."""
        ranks, rank_inv = np.unique(self.rank[idx], return_inverse=True)
        nm = max(len(self.modes), 1)
        key = self.node[idx] * len(ranks) + rank_inv
        if by_mode:
            key = key * nm + self.mode[idx]
        uniq, inv = np.unique(key, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
        return self._named(uniq.tolist(), ranks, nm, by_mode, idx, order, bounds)

    def _named(self, keys: list[int], ranks: np.ndarray, nm: int, by_mode: bool, idx: np.ndarray,
               order: np.ndarray, bounds: np.ndarray) -> list[tuple[tuple, np.ndarray]]:
        out = []
        for g, k in enumerate(keys):
            m = 0
            if by_mode:
                k, m = divmod(k, nm)
            n, r = divmod(k, len(ranks))
            name = (self.nodes[n], int(ranks[r])) + ((self.modes[m],) if by_mode else ())
            out.append((name, idx[order[bounds[g]:bounds[g + 1]]]))
        return out


_DENSE_RANKS = 4096  # groups() counts ranks spanning at most this many numbers; wider spans sort instead


def _lookup(names: list[str], wanted: set[str], codes: np.ndarray, n: int) -> np.ndarray:
    """Rows whose code stands for one of `wanted`: a lookup table indexed by the codes."""
    table = np.array([name in wanted for name in names], bool)
    return table[codes] if table.any() else np.zeros(n, bool)


def framework_columns(chunk: Chunk) -> FrameworkColumns:
    """The chunk's framework events as FrameworkColumns, built once per chunk and shared by every rule
    that asks (they only read it). Cached on the chunk, for as long as its events table is the same."""
    table = chunk.framework
    cached = chunk.__dict__.get(_CACHE)
    if cached is not None and cached.table is table:
        return cached
    cols = FrameworkColumns(table)
    chunk.__dict__[_CACHE] = cols
    return cols


def new_events(chunk: Chunk) -> FrameworkColumns | None:
    """The chunk's framework events as columns (`framework_columns`), or None when it brings none."""
    table = chunk.framework
    if table is None or table.num_rows == 0:
        return None
    return framework_columns(chunk)


_CACHE = "_framework_columns"


def attach_columns(chunk: Chunk, cols: FrameworkColumns) -> None:
    """Make `cols` (decoded elsewhere: a Dask worker) the chunk's shared view; its table is the chunk's events."""
    assert cols.table is chunk.framework
    chunk.__dict__[_CACHE] = cols


def unmeasured_waits(cols: FrameworkColumns, table: pa.Table) -> set[tuple[str, int]]:
    """The (node, rank)s whose `loop` marker lists the phases their steps record without a data wait (Keras on
    TensorFlow reads its input inside the compiled step): their waiting is not measured, not absent."""
    import json

    out: set[tuple[str, int]] = set()
    rows = np.flatnonzero(cols.kind_is("loop"))
    if not rows.size:
        return out
    for i, text in zip(rows.tolist(), table["args"].take(rows).to_pylist()):
        try:
            args = json.loads(text) if text else None
        except ValueError:
            continue
        if isinstance(args, dict) and isinstance(args.get("phases"), list) and DATA_WAIT not in args["phases"]:
            out.add((cols.nodes[cols.node[i]], int(cols.rank[i])))
    return out


def rank_key(node: str, rank: int, mode: str | None = None) -> str:
    """How rules name a rank (and phase) in Details: "node/rank[/MODE]", as the store lays out framework files."""
    return f"{node}/{rank}" + (f"/{mode}" if mode else "")


def mode_order(mode: str) -> int:
    return MODES.index(mode) if mode in MODES else len(MODES)
