"""Rules over the training loop's steps: StepOutlier (slow steps) and MaxInitializationTime (how long the job
took to reach its first step). Also the column helpers the framework rules share (`FrameworkColumns`).

Both rules keep what they need of every step and decide in `result()` from everything seen so far, with
exact integer sums and a canonical order (per group, by step number then start), so the answer depends on the
data only: one chunk or many gives the same result."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze.contention import own_time, step_runq
from stallwatch.analyze.rules.base import Chunk, ParameterError, Replay, Rule, RuleResult
from stallwatch.analyze.rules.gpu import check_non_negative
from stallwatch.analyze.rules.stats import Distribution
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, MODES, OPTIMIZER, STEP
from stallwatch.timeutil import format_duration

MAX_LISTED = 100  # outlier steps listed per rank and phase (the slowest ones)
HISTOGRAM_BINS = 100  # SageMaker's step histogram resolution
US = 1_000_000


# --------------------------------------------------------------------------------------------------
# Shared by the framework rules (steps, dataloader, framework_metrics)


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


# --------------------------------------------------------------------------------------------------
# StepOutlier

# Framework context of a step: the time its own events spent in each of these kinds (by `step`+`mode`).
CONTEXT_KINDS = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE)
_OTHER = len(CONTEXT_KINDS)  # any other kind with a step number
_RECORDED = _OTHER + 1  # kinds recorded per step number; "outside_phases" is derived per step
# "outside_phases": the step's time in none of its recorded events (the loop's own code between phases).
_CONTEXT_NAMES = CONTEXT_KINDS + ("other", "outside_phases")
_DENSE_SPAN = 1 << 22  # step numbers per (rank, phase) whose context is kept (from the smallest seen)


GROWTH = 4  # growing columns and tables grow by 1/GROWTH: appends stay amortised O(new) (each value is copied
# about GROWTH times), and at most a fifth of a node-day of per-step state is room not yet used (doubling: half)


class Appendable:
    """A numpy column that grows by a share (`GROWTH`): appends cost O(new) amortised, reads are views. With `narrow`,
    integers are kept as int32 while every value fits (half the memory of a rule's per-step columns: step
    numbers, durations) and as int64 from the first that does not; they read back as int64 either way."""

    def __init__(self, dtype: Any = np.int64, *, narrow: bool = False) -> None:
        self._data = np.empty(0, np.int32 if narrow else dtype)
        self._narrow = narrow
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        if self._data.dtype == np.int32 and len(values) and not _fits_int32(values):
            self._data = self._data.astype(np.int64)
        need = self.n + len(values)
        if need > len(self._data):
            grown = np.empty(max(need, len(self._data) + len(self._data) // GROWTH, 1024), self._data.dtype)
            grown[: self.n] = self._data[: self.n]
            self._data = grown
        self._data[self.n: need] = values
        self.n = need

    def view(self) -> np.ndarray:
        data = self._data[: self.n]
        return data.astype(np.int64) if data.dtype == np.int32 else data


def _fits_int32(values: np.ndarray) -> bool:
    return int(values.min()) >= -(1 << 31) and int(values.max()) < (1 << 31)


def _store(table: np.ndarray, rows: np.ndarray | slice, values: np.ndarray) -> np.ndarray:
    """`table[rows] = values`, first widening an int32 table to int64 when a value does not fit; the table."""
    if table.dtype == np.int32 and np.size(values) and not _fits_int32(np.asarray(values)):
        table = table.astype(np.int64)
    table[rows] = values
    return table


class _Series:
    """One (node, rank, phase)'s steps, kept so that `result()` costs little however many there are: exact
    integer sums for mean and std; the durations as a Distribution (percentiles, histogram, outlier count);
    every step's number, start and duration in arrival order (to name the outliers); and per step number the
    time its events spent in each context kind, with running totals over all steps (the normal steps'
    context is the totals minus the outliers')."""

    def __init__(self) -> None:
        self.n = self.s1 = self.s2 = 0  # Python ints: exact, whatever the order of arrival
        self.durations = Distribution(None, np.float64)  # µs
        self.step, self.start, self.dur = Appendable(narrow=True), Appendable(), Appendable(narrow=True)
        self.base = 0  # step number of row 0 of the dense tables
        # per step number: µs per recorded kind, and the duration of its step (when it has one); int32 while
        # every value fits (35 minutes), int64 from the first that does not (`_store`)
        self.ctx = np.zeros((0, _RECORDED), np.int32)
        self.occ = np.zeros(0, np.int32)  # per step number: steps seen with it
        self.first = np.zeros(0, np.int32)
        self.totals = np.zeros(_RECORDED + 1, np.int64)  # over every step: µs per kind, then outside_phases
        self.duplicates = False  # a step number seen twice: outside_phases is then summed in result()

    def _dense(self, numbers: np.ndarray) -> np.ndarray:
        """Which of `numbers` have a row in the dense tables (grown to hold them, within _DENSE_SPAN)."""
        ok = numbers >= 0
        if not ok.any():
            return ok
        lo, hi = int(numbers[ok].min()), int(numbers[ok].max())
        size = len(self.occ)
        new_lo = lo if size == 0 else min(lo, self.base)
        new_hi = hi if size == 0 else max(hi, self.base + size - 1)
        new_hi = min(new_hi, new_lo + _DENSE_SPAN - 1)
        if size == 0 or new_lo < self.base or new_hi >= self.base + size:
            cap = new_hi - new_lo + 1
            if size:  # grow by a share towards higher numbers, so appends stay amortised
                cap = min(max(cap, size + size // GROWTH), _DENSE_SPAN)
            ctx, occ = np.zeros((cap, _RECORDED), self.ctx.dtype), np.zeros(cap, np.int32)
            first = np.zeros(cap, self.first.dtype)
            at = self.base - new_lo
            ctx[at: at + size], occ[at: at + size], first[at: at + size] = self.ctx, self.occ, self.first
            self.base, self.ctx, self.occ, self.first = new_lo, ctx, occ, first
        return ok & (numbers >= self.base) & (numbers < self.base + len(self.occ))

    def add_context(self, numbers: np.ndarray, kinds: np.ndarray, us: np.ndarray) -> None:
        """Events of steps: µs in kind per step number."""
        keep = self._dense(numbers)
        numbers, kinds, us = numbers[keep], kinds[keep], us[keep]
        if numbers.size == 0:
            return
        lo, hi = int(numbers.min()), int(numbers.max())
        flat = (numbers - lo) * _RECORDED + kinds
        delta = np.bincount(flat, weights=us, minlength=(hi - lo + 1) * _RECORDED)  # exact below 2^53 µs
        delta = delta.astype(np.int64).reshape(-1, _RECORDED)
        touched = np.flatnonzero(delta.any(axis=1))
        rows = touched + (lo - self.base)
        delta = delta[touched]
        before = self.ctx[rows].sum(axis=1)
        self.ctx = _store(self.ctx, rows, self.ctx[rows] + delta)
        occ = self.occ[rows].astype(np.int64)
        self.totals[:_RECORDED] += (occ[:, None] * delta).sum(axis=0)
        single = occ == 1  # steps seen more than once: outside_phases is summed in result()
        if single.any():
            d = self.first[rows[single]]
            self.totals[_RECORDED] += int((np.maximum(d - before[single] - delta[single].sum(axis=1), 0)
                                           - np.maximum(d - before[single], 0)).sum())

    def add_steps(self, numbers: np.ndarray, starts: np.ndarray, durs: np.ndarray) -> None:
        self.n += len(durs)
        self.s1 += int(durs.sum())
        self.s2 += _sum_squares(durs)
        self.durations.add(durs)
        self.step.extend(numbers)
        self.start.extend(starts)
        self.dur.extend(durs)
        keep = self._dense(numbers)
        self.totals[_RECORDED] += int(durs[~keep].sum())  # no context kept: all of it outside phases
        rows = numbers[keep] - self.base
        d = durs[keep]
        if rows.size == 0:
            return
        seen = np.bincount(rows, minlength=len(self.occ))
        if (self.occ[rows] > 0).any() or (seen > 1).any():
            self.duplicates = True
        self.occ += seen.astype(np.int32)
        self.first = _store(self.first, rows, d)  # only read while every step number has one step
        ctx = self.ctx[rows]
        self.totals[:_RECORDED] += ctx.sum(axis=0)
        self.totals[_RECORDED] += int(np.maximum(d - ctx.sum(axis=1), 0).sum())

    @property
    def nbytes(self) -> int:
        """Bytes held: its columns (with their room to grow), dense tables and durations."""
        return int(sum(c._data.nbytes for c in (self.step, self.start, self.dur)) + self.ctx.nbytes + self.occ.nbytes
                   + self.first.nbytes + self.durations.nbytes)

    def context_of(self, rows: np.ndarray) -> np.ndarray:
        """steps (rows of the arrival-order columns) × context kinds, µs, outside_phases last."""
        numbers, durs = self.step.view()[rows], self.dur.view()[rows]
        out = np.zeros((len(rows), _RECORDED + 1), np.int64)
        ok = (numbers >= self.base) & (numbers < self.base + len(self.occ))
        out[ok, :_RECORDED] = self.ctx[numbers[ok] - self.base]
        out[:, _RECORDED] = np.maximum(durs - out[:, :_RECORDED].sum(axis=1), 0)
        return out

    def context_totals(self) -> np.ndarray:
        if not self.duplicates:
            return self.totals
        totals = self.totals.copy()
        totals[_RECORDED] = int(self.context_of(np.arange(self.n))[:, _RECORDED].sum())
        return totals


def _sum_squares(values: np.ndarray) -> int:
    """Exact sum of squares of non-negative int64 values (durations in µs), as a Python int."""
    v = np.asarray(values, np.int64)
    small = v < (1 << 31)  # squares below 2^62: summed in two 32-bit halves, which cannot overflow
    sq = (v[small] * v[small]).astype(np.uint64)
    total = (int((sq >> np.uint64(32)).sum()) << 32) + int((sq & np.uint64(0xFFFFFFFF)).sum())
    return total + sum(int(x) * int(x) for x in v[~small].tolist())


@dataclass(frozen=True)
class SeriesFacts:
    """What a (node, rank, phase) series' verdict is computed from, given its outlier threshold: the same numbers
    whether its steps were held in memory (`series_facts`) or the node was read again (`step_stream`)."""

    n: int
    s1: int  # µs, summed
    s2: int  # µs², summed
    normal: int  # steps at or under the threshold
    outlier_us: int  # the outliers' durations, summed
    percentiles: tuple[float, float, float]  # p99, p95, p50 (µs)
    min_us: float
    max_us: float
    histogram: tuple[np.ndarray, np.ndarray]  # counts and edges (µs) of the normal steps
    listed_steps: np.ndarray  # the slowest outliers (at most MAX_LISTED), by step number then start
    listed_us: np.ndarray
    listed_starts: np.ndarray
    outlier_context: np.ndarray  # µs per context kind over the outliers
    context_totals: np.ndarray  # … over every step


def listed(rows: np.ndarray, durs: np.ndarray) -> np.ndarray:
    """Of outlier `rows` (in step-then-start order), the MAX_LISTED slowest, in the same order (ties: the first)."""
    if rows.size <= MAX_LISTED:
        return rows
    return rows[np.sort(np.argsort(-durs[rows], kind="stable")[:MAX_LISTED])]


def series_facts(s: _Series, limit_us: float) -> SeriesFacts:
    """A series' facts from its steps held in memory."""
    normal = s.durations.count_le(limit_us)
    durs = s.dur.view()
    out_rows = np.flatnonzero(durs > limit_us)
    out_rows = out_rows[np.lexsort((s.start.view()[out_rows], s.step.view()[out_rows]))]  # step, then start
    out_sums = s.context_of(out_rows).sum(axis=0)
    shown = listed(out_rows, durs)
    return SeriesFacts(
        n=s.n, s1=s.s1, s2=s.s2, normal=normal, outlier_us=int(durs[out_rows].sum()),
        percentiles=tuple(s.durations.percentiles((99, 95, 50))),  # type: ignore[arg-type]
        min_us=s.durations.min(), max_us=s.durations.max(),
        histogram=s.durations.histogram(HISTOGRAM_BINS, upto=normal),
        listed_steps=s.step.view()[shown], listed_us=durs[shown], listed_starts=s.start.view()[shown],
        outlier_context=out_sums, context_totals=s.context_totals())


class StepOutlier(Rule):
    """Per rank and phase (mode), a step is an outlier when its duration exceeds mean + `stddev` × standard
    deviation (population std, ddof=0) of that rank's steps of that phase; a (rank, phase) *fires* when it
    has more than `n_outliers` outliers *and* their excess time (each outlier's duration minus the series'
    median, summed) is at least `min_excess_pct` % of the series' time: thousands of jitter outliers among
    millions of sub-millisecond steps are not a finding, 15 stalls of 0.25 s in a 7 s loop are.

    Evaluation points: one per (node, rank, phase) series, evaluated on every step of it seen so far (mean
    and std need all of them, so there is no per-step verdict that later steps would not change). The
    result at any time is the verdict on the data so far; on a finished run it is the batch verdict, however
    the data was chunked. RuleTriggered = series that fire; Violations = outlier steps of firing series;
    Datapoints = steps evaluated.

    Mean and std come from exact integer sums of the µs durations; the comparison is made in µs. The
    context of a step (time per phase kind) is kept for a span of 4 M step numbers per series.

    `mode` restricts to one phase (TRAIN, EVAL or GLOBAL, any case); None evaluates each phase on its own.
    `threshold` is SageMaker's report name for the same multiplier: it is kept (RuleParameters) for old
    tooling but the multiplier used is `stddev`."""

    name = "StepOutlier"
    metrics = ()  # framework events only
    description = ("Detects outliers in step duration. The step duration for forward and backward pass should be "
                   "roughly the same throughout the training. If there are significant outliers, "
                   "it may indicate a system stall or bottleneck issues.")
    recommendation = "Check if there are any bottlenecks (CPU, I/O) correlated to the step outliers."
    defaults = {"threshold": 3, "mode": None, "n_outliers": 10, "stddev": 3, "min_excess_pct": 5.0}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        mode = self.params["mode"]
        if mode is not None:
            text = str(mode).strip().upper().rsplit(".", 1)[-1]  # "train", "ModeKeys.TRAIN" -> TRAIN
            if text not in MODES:
                raise ParameterError(f"{self.name}.mode={mode!r}: must be one of {', '.join(MODES)} or None")
            self.params["mode"] = text
        check_non_negative(self, "n_outliers", "stddev", "threshold", "min_excess_pct")
        self._modes = (self.params["mode"],) if self.params["mode"] else MODES
        self._series: dict[tuple[str, int, str], _Series] = {}
        self._judged: dict[tuple[str, int, str], _Judged] = {}  # series of nodes whose data is complete
        self._events = 0
        # Batch feeds (`Chunk.replay`): a node whose steps pass step_stream.NODE_BYTES is streamed (its series
        # reduced to sums and counts) and read again once complete; per node and phase, where each span of step
        # numbers lies in time, tracked from its first chunk.
        self._replay: Replay | None = None
        self._streamed: dict[tuple[str, int, str], Any] = {}  # step_stream.StreamedSeries, by series
        self._spans: dict[str, dict[str, dict[int, list[int]]]] = {}  # node -> phase -> span -> [first, last start]
        self._rates: dict[str, list[int]] = {}  # node -> [events, first start, last start]: how long a piece to read

    def update(self, chunk: Chunk) -> None:
        self._replay = chunk.replay or self._replay
        self._add(chunk)
        for node in chunk.done:
            self._close(node)

    def _add(self, chunk: Chunk) -> None:
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        if chunk.replay is not None:
            track_spans(cols, cols.mode_is(self._modes) & (cols.step >= 0), self._spans, self._rates)

        def series_of(key: tuple[str, int, str]) -> Any:
            s = self._streamed.get(key)
            if s is None:
                s = self._series.get(key)
            if s is None:
                s = self._series[key] = _Series()
            return s

        self.add_events(cols, series_of)
        if chunk.replay is not None:
            self._stream_long_nodes()

    def add_events(self, cols: FrameworkColumns, series_of: Any) -> None:
        """Hand each (node, rank, phase)'s events of `cols` to `series_of(key)` (skipped where it gives None): their
        time per context kind, then their steps (a step arriving with its events then adds their time once)."""
        in_mode = cols.mode_is(self._modes)
        is_step = cols.kind_is(STEP)
        ctx = in_mode & ~is_step & (cols.step >= 0)
        if ctx.any():
            kind_code = np.full(len(cols.kinds), _OTHER, np.int64)
            for i, k in enumerate(cols.kinds):
                if k in CONTEXT_KINDS:
                    kind_code[i] = CONTEXT_KINDS.index(k)
            for key, rows in cols.groups(ctx):
                s = series_of(key)
                if s is not None:
                    s.add_context(cols.step[rows], kind_code[cols.kind[rows]],
                                  np.maximum(cols.end[rows] - cols.start[rows], 0))
        for key, rows in cols.groups(is_step & in_mode):
            s = series_of(key)
            if s is not None:  # judged on the steps' own time: waiting for a CPU is CPUContention's
                s.add_steps(cols.step[rows], cols.start[rows],
                            own_time(cols.end[rows] - cols.start[rows], step_runq(cols, rows)))

    def _stream_long_nodes(self) -> None:
        """Where a node's steps held in memory pass NODE_BYTES, its largest series are streamed from now on, until
        half of that is held (a phase whose series are all held is not read again)."""
        from stallwatch.analyze.rules import step_stream

        for key in step_stream.too_long(self._series):
            self._streamed[key] = step_stream.StreamedSeries.of(self._series.pop(key))

    def limit_us(self, n: int, s1: int, s2: int) -> tuple[float, float, float]:
        """Mean, population std and outlier threshold (µs) from a series' exact sums."""
        mean_us = s1 / n
        std_us = math.sqrt(max(n * s2 - s1 * s1, 0) / (n * n))
        return mean_us, std_us, mean_us + float(self.params["stddev"]) * std_us

    def _judge(self, key: tuple[str, int, str], s: _Series) -> _Judged:
        """One series' verdict and Details entry: all that `result()` needs of it once its data is complete."""
        return self.judged(key, series_facts(s, self.limit_us(s.n, s.s1, s.s2)[2]))

    def judged(self, key: tuple[str, int, str], f: SeriesFacts) -> _Judged:
        """The verdict and Details entry of a series from its facts (held in memory or read again)."""
        node, rank, mode = key
        limit = self.params["n_outliers"]
        min_excess = float(self.params["min_excess_pct"])
        n, normal = f.n, f.normal
        mean_us, std_us, limit_us = self.limit_us(n, f.s1, f.s2)
        n_out = n - normal
        p99, p95, p50 = (x / US for x in f.percentiles)
        # what the outliers cost over a typical step: a few stalls in a short loop matter, thousands of
        # sub-millisecond jitter outliers among millions of steps do not
        excess_us = max(f.outlier_us - n_out * p50 * US, 0.0)
        excess_pct = 100.0 * excess_us / f.s1 if f.s1 > 0 else 0.0
        fires = n_out > limit and excess_pct >= min_excess
        counts, edges = f.histogram
        entry = {
            "node": node, "rank": rank, "phase": mode,
            "steps": int(n),
            "step_stats": {"mean": mean_us / US, "max": f.max_us / US, "p99": p99, "p95": p95,
                           "p50": p50, "min": f.min_us / US},
            "number_of_outliers": n_out,
            "excess_s": excess_us / US,
            "excess_pct": excess_pct,
            "stddev": std_us / US,
            "outlier_threshold": limit_us / US,
            "triggered": bool(fires),
            "probs": (counts / counts.sum()).tolist() if normal else [],
            "binedges": (edges / US).tolist() if normal else [],
            "step_numbers": f.listed_steps.tolist(),
            "outliers": (f.listed_us / US).tolist(),
            "outlier_start_us": f.listed_starts.tolist(),
            "outliers_listed": int(f.listed_steps.size),
            "framework_context": {
                "outlier_steps": _mean_per_kind(f.outlier_context, n_out),
                "normal_steps": _mean_per_kind(f.context_totals - f.outlier_context, normal),
            },
        }
        return _Judged(entry, bool(fires), int(n), int(n_out), int(f.outlier_us), f.outlier_context)

    def _close(self, node: str) -> None:
        """The node's data is complete: judge its series now and keep only their verdicts."""
        for key in [key for key in self._series if key[0] == node]:
            s = self._series.pop(key)
            if s.n:
                self._judged[key] = self._judge(key, s)
        streamed = {key: self._streamed.pop(key) for key in [key for key in self._streamed if key[0] == node]}
        spans = self._spans.pop(node, {})
        events, first, last = self._rates.pop(node, [0, 0, 0])
        if streamed:
            from stallwatch.analyze.rules import step_stream

            assert self._replay is not None  # series are streamed only where the run can be read again
            piece_us = step_stream.PIECE_EVENTS * (last - first + 1) // max(events, 1)
            facts = step_stream.node_facts(node, streamed, spans, self._replay,
                                           lambda s: self.limit_us(s.n, s.s1, s.s2)[2], self.add_events, piece_us)
            for key, f in facts.items():
                self._judged[key] = self.judged(key, f)

    def merge(self, other: Rule, node: str) -> None:
        """`node`'s verdicts (its series, were it never said complete) and event count: every series is one node's,
        judged on that node's steps alone, and `result()` orders them by key, so the feed's order does not show."""
        assert isinstance(other, StepOutlier)
        self._events += other._events
        self._judged.update(_of_node(other._judged, node))
        self._series.update(_of_node(other._series, node))
        self._streamed.update(_of_node(other._streamed, node))
        if node in other._spans:
            self._spans[node] = other._spans[node]
        if node in other._rates:
            self._rates[node] = other._rates[node]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a worker's rule sent back) without the run read again: the caller's rule has its own."""
        state = dict(self.__dict__)
        state["_replay"] = None
        return state

    def result(self) -> RuleResult:
        if self._events == 0:
            return self.not_applicable("no framework data: the job recorded no steps (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        for node in sorted({key[0] for key in self._streamed}):  # a node never said complete (a feed without `done`)
            self._close(node)
        series = {key: s for key, s in self._series.items() if s.n}
        if not series and not self._judged:
            which = f"{self.params['mode']} " if self.params["mode"] else ""
            return self.not_applicable(f"no {which}steps in the framework data")
        details: dict[str, Any] = {}
        triggered = violations = datapoints = 0
        phase_us: dict[str, int] = {}
        kinds_us = np.zeros(len(_CONTEXT_NAMES), np.int64)
        judged = {**self._judged, **{key: self._judge(key, s) for key, s in series.items()}}
        for key in sorted(judged, key=lambda g: (g[0], g[1], mode_order(g[2]))):
            j = judged[key]
            datapoints += j.steps
            details[rank_key(*key)] = j.entry
            if j.fires:
                triggered += 1
                violations += j.outliers
                phase_us[key[2]] = phase_us.get(key[2], 0) + j.outlier_us
                kinds_us += j.context_us
        result_details: dict[str, Any] = {
            "step_details": details,
            "phase": _percent(phase_us),
            "forward_backward": _percent({n: int(v) for n, v in zip(_CONTEXT_NAMES, kinds_us) if v > 0}),
        }
        recommendation = None
        if triggered:
            fired = [f"{key} ({e['number_of_outliers']} outliers of {e['steps']} steps, mean "
                     f"{e['step_stats']['mean']:.3g} s, max {e['step_stats']['max']:.3g} s)"
                     for key, e in details.items() if e["triggered"]]
            top = max(result_details["forward_backward"].items(), key=lambda kv: kv[1], default=None)
            label = {"outside_phases": "the loop's own code, outside data loading, forward, backward and the "
                                       "optimizer step", "data_wait": "waiting for data"}.get(top[0], top[0]) if top else ""
            extra = f" During the outlier steps most of the time went to {label} ({top[1]:.0f} %)." if top else ""
            recommendation = (f"{self.recommendation} Outliers on: {'; '.join(fired[:10])}"
                              f"{' …' if len(fired) > 10 else ''}.{extra}")
        return self.make_result(triggered=triggered, violations=violations, datapoints=datapoints,
                                details=result_details, recommendation=recommendation)


_V = TypeVar("_V")


def _of_node(by_series: dict[tuple[str, int, str], _V], node: str) -> dict[tuple[str, int, str], _V]:
    """The entries of `node`'s series (a merged worker's rule brings only its own node's)."""
    return {key: value for key, value in by_series.items() if key[0] == node}


@dataclass(frozen=True)
class _Judged:
    """A (node, rank, phase) series reduced to its verdict once its node's data is complete (a few kB, whatever
    its number of steps): the Details entry and what the run's totals add up from it."""

    entry: dict[str, Any]
    fires: bool
    steps: int
    outliers: int
    outlier_us: int  # summed durations of its outlier steps
    context_us: np.ndarray  # µs per context kind over its outlier steps


def track_spans(cols: FrameworkColumns, numbered: np.ndarray, spans: dict[str, dict[str, dict[int, list[int]]]],
                rates: dict[str, list[int]]) -> None:
    """What reading a node again needs (batch feeds): per node and phase, where each span of step numbers of the
    `numbered` rows lies in time (`step_stream.widen`, a rank's rows at a time); per node, how many of them there
    are between their first and last start (the rate it is read at)."""
    from stallwatch.analyze.rules import step_stream

    for (node, _, mode), rows in cols.groups(numbered):
        step_stream.widen(spans.setdefault(node, {}).setdefault(mode, {}), cols.step[rows], cols.start[rows])
        lo, hi = int(cols.start[rows].min()), int(cols.start[rows].max())
        seen = rates.setdefault(node, [0, lo, hi])
        seen[0] += len(rows)
        seen[1], seen[2] = min(seen[1], lo), max(seen[2], hi)


def _mean_per_kind(sums: np.ndarray, steps: int) -> dict[str, float]:
    """Mean seconds per step in each kind (kinds never seen are left out)."""
    if steps <= 0:
        return {}
    return {n: float(s) / steps / US for n, s in zip(_CONTEXT_NAMES, sums) if s > 0}


def _percent(values: dict[str, int]) -> dict[str, float]:
    total = sum(values.values())
    if total <= 0:
        return {}
    return {k: 100.0 * v / total for k, v in sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))}


# --------------------------------------------------------------------------------------------------
# MaxInitializationTime


class MaxInitializationTime(Rule):
    """Fires when the first step (of any phase) starts more than `threshold` minutes after the job started.

    Evaluation point: one, the deadline job start + `threshold`. It holds when no step started by then and
    the data shows the deadline has passed: a step that started later, or any snapshot or event later than
    it ("now" is the latest timestamp in the data, never the wall clock, so live and batch agree). In live
    mode it therefore fires as soon as data past the deadline arrives without a step before it.

    Job start: the run's `start_us` (earliest node start), else the earliest datum. Without any framework
    event the run may simply not be instrumented: the rule still fires while the run is live (a job stuck
    in initialization sends nothing), but a finished run without framework data is not applicable."""

    name = "MaxInitializationTime"
    metrics = ()  # of snapshots, only their timestamps
    description = ("Checks how long the job took to reach its first training step. The rule waits until the first "
                   "step of the training loop starts and triggers when that took longer than the threshold. "
                   "Initialization can take long when the whole data set is downloaded or preprocessed before "
                   "training, or when distributed workers wait for each other to join. The default threshold is "
                   "20 minutes.")
    recommendation = ("Initialization takes too long. Stream or shard the data set instead of copying it whole before "
                      "training (an IterableDataset reading from object storage, for example), cache preprocessed "
                      "data between runs, and check how long distributed workers take to join.")
    defaults = {"threshold": 20}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        value = self.params["threshold"]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ParameterError(f"{self.name}.threshold={value!r}: must be a number of minutes >= 0")
        self._run: dict[str, Any] = {}
        self._final = False
        self._events = 0
        self._steps = 0
        self._first_step: int | None = None
        self._last_step_end: int | None = None
        self._node_first: dict[str, int] = {}
        self._data_min: int | None = None
        self._data_max: int | None = None

    def _seen(self, lo: int, hi: int) -> None:
        self._data_min = lo if self._data_min is None else min(self._data_min, lo)
        self._data_max = hi if self._data_max is None else max(self._data_max, hi)

    def update(self, chunk: Chunk) -> None:
        self._run = chunk.run or self._run
        self._final = self._final or chunk.final
        for frame in chunk.system.values():
            if len(frame):
                self._seen(int(frame.timestamps.min()), int(frame.timestamps.max()))
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        self._seen(int(cols.start.min()), int(max(cols.end.max(), cols.start.max())))
        is_step = cols.kind_is(STEP)
        if not is_step.any():
            return
        self._steps += int(is_step.sum())
        first, last = int(cols.start[is_step].min()), int(cols.end[is_step].max())
        self._first_step = first if self._first_step is None else min(self._first_step, first)
        self._last_step_end = last if self._last_step_end is None else max(self._last_step_end, last)
        for (node, _), rows in cols.groups(is_step, by_mode=False):
            t = int(cols.start[rows].min())
            self._node_first[node] = min(self._node_first.get(node, t), t)

    def merge(self, other: Rule, node: str) -> None:
        assert isinstance(other, MaxInitializationTime)
        self._run = other._run or self._run
        self._final = self._final or other._final
        self._events += other._events
        self._steps += other._steps
        self._first_step = _least(self._first_step, other._first_step)
        self._last_step_end = _most(self._last_step_end, other._last_step_end)
        self._node_first.update(other._node_first)
        self._data_min = _least(self._data_min, other._data_min)
        self._data_max = _most(self._data_max, other._data_max)

    def result(self) -> RuleResult:
        run = self._run
        job_start = run.get("start_us")
        if job_start is None:
            starts = [n.get("start_us") for n in (run.get("nodes") or {}).values() if n.get("start_us") is not None]
            job_start = min(starts) if starts else self._data_min
        if job_start is None:
            return self.not_applicable("no data: neither the job's start nor any snapshot or event is known")
        job_start = int(job_start)
        run_end = run.get("end_us")
        now = self._data_max if self._data_max is not None else job_start
        if self._final and run_end is not None:
            now = max(now, int(run_end))
        job_end = int(run_end) if run_end is not None else now
        limit_us = float(self.params["threshold"]) * 60 * US
        first, last = self._first_step, self._last_step_end
        details: dict[str, Any] = {
            "job_start": job_start, "job_end": job_end, "first_step": first, "last_step": last,
            "step_num": {"first": first, "last": last} if first is not None else {},
            "initialization_s": (first - job_start) / US if first is not None else None,
            "training_loop_s": (last - first) / US if first is not None else None,
            "finalization_s": max(job_end - last, 0) / US if last is not None else None,
            "waited_s": ((min(first, now) if first is not None else now) - job_start) / US,
            "threshold_s": limit_us / US,
            "nodes": _node_starts(run, self._node_first),
        }
        if self._events == 0 and self._final:
            return self.not_applicable("no framework data: no step was recorded, so the initialization time is "
                                       "unknown (the job never reached its training loop, or PyTorch was not "
                                       "profiled)", details)
        if first is not None:
            fires = first - job_start > limit_us
        else:
            fires = now - job_start > limit_us
        message = ""
        if fires and first is None:
            message = (f"no step after {(now - job_start) / 60 / US:.1f} minutes (threshold "
                       f"{self.params['threshold']} minutes)")
            if self._events == 0:
                message += "; no framework event has arrived yet"
        recommendation = None
        if fires:
            waited = (first if first is not None else now) - job_start
            what = "started" if first is not None else "has not started after"
            recommendation = (f"The first training step {what} {format_duration(waited / US)} after the job "
                              f"started (threshold {self.params['threshold']} minutes). " + self.recommendation)
        return self.make_result(triggered=int(fires), violations=int(fires), datapoints=self._steps,
                                details=details, message=message, recommendation=recommendation)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _node_starts(run: dict[str, Any], first_steps: dict[str, int]) -> dict[str, dict[str, Any]]:
    nodes = run.get("nodes") or {}
    out = {}
    for node in sorted(set(nodes) | set(first_steps)):
        start = (nodes.get(node) or {}).get("start_us")
        first = first_steps.get(node)
        out[node] = {"start_us": start, "first_step": first,
                     "initialization_s": (first - start) / US if first is not None and start is not None else None}
    return out
