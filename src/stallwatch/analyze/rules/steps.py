"""Rules over the training loop's steps: StepOutlier (slow steps) and MaxInitializationTime (how long the job
took to reach its first step). Also the column helpers the framework rules share (`FrameworkColumns`).

Both rules keep what they need of every step as numpy arrays and decide in `result()` from everything seen
so far, in a canonical order (per group, by step number then start), so the answer depends on the data only:
one chunk or many gives the same result."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze.rules.base import Chunk, ParameterError, Rule, RuleResult
from stallwatch.analyze.rules.stats import histogram
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, MODES, OPTIMIZER, STEP

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


_CACHE = "_framework_columns"


def rank_key(node: str, rank: int, mode: str | None = None) -> str:
    """How rules name a rank (and phase) in Details: "node/rank[/MODE]", as the store lays out framework files."""
    return f"{node}/{rank}" + (f"/{mode}" if mode else "")


def mode_order(mode: str) -> int:
    return MODES.index(mode) if mode in MODES else len(MODES)


def _concat(parts: list[np.ndarray], dtype: Any = np.int64) -> np.ndarray:
    if not parts:
        return np.empty(0, dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


# --------------------------------------------------------------------------------------------------
# StepOutlier

# Framework context of a step: the time its own events spent in each of these kinds (by `step`+`mode`).
CONTEXT_KINDS = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE)
_OTHER = len(CONTEXT_KINDS)  # any other kind with a step number
# "outside_phases": the step's time in none of its recorded events (the loop's own code between phases).
_CONTEXT_NAMES = CONTEXT_KINDS + ("other", "outside_phases")
_STEP_BITS, _KIND_BITS = 40, 4


class StepOutlier(Rule):
    """Per rank and phase (mode), a step is an outlier when its duration exceeds mean + `stddev` × standard
    deviation (population std, ddof=0) of that rank's steps of that phase; a (rank, phase) *fires* when it
    has more than `n_outliers` outliers.

    Evaluation points: one per (node, rank, phase) series, evaluated on every step of it seen so far (mean
    and std need all of them, so there is no per-step verdict that later steps would not change). The
    result at any time is the verdict on the data so far; on a finished run it is the batch verdict, however
    the data was chunked. RuleTriggered = series that fire; Violations = outlier steps of firing series;
    Datapoints = steps evaluated.

    `mode` restricts to one phase (TRAIN, EVAL or GLOBAL, any case); None evaluates each phase on its own.
    `threshold` is SageMaker's report name for the same multiplier: it is kept (RuleParameters) for old
    tooling but the multiplier used is `stddev`."""

    name = "StepOutlier"
    metrics = ()  # framework events only
    description = ("Detects outliers in step duration. The step duration for forward and backward pass should be "
                   "roughly the same throughout the training. If there are significant outliers, "
                   "it may indicate a system stall or bottleneck issues.")
    recommendation = "Check if there are any bottlenecks (CPU, I/O) correlated to the step outliers."
    defaults = {"threshold": 3, "mode": None, "n_outliers": 10, "stddev": 3}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        mode = self.params["mode"]
        if mode is not None:
            text = str(mode).strip().upper().rsplit(".", 1)[-1]  # "train", "ModeKeys.TRAIN" -> TRAIN
            if text not in MODES:
                raise ParameterError(f"{self.name}.mode={mode!r}: must be one of {', '.join(MODES)} or None")
            self.params["mode"] = text
        for key in ("n_outliers", "stddev", "threshold"):
            value = self.params[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ParameterError(f"{self.name}.{key}={value!r}: must be a number >= 0")
        self._modes = (self.params["mode"],) if self.params["mode"] else MODES
        self._gid: dict[tuple[str, int, str], int] = {}
        self._steps: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}  # gid -> [(step, start, dur)]
        self._ctx_keys: list[np.ndarray] = []
        self._ctx_us: list[np.ndarray] = []
        self._events = 0

    def _group_id(self, key: tuple[str, int, str]) -> int:
        if key not in self._gid:
            self._gid[key] = len(self._gid)
        return self._gid[key]

    def update(self, chunk: Chunk) -> None:
        table = chunk.framework
        if table is None or table.num_rows == 0:
            return
        self._events += table.num_rows
        cols = framework_columns(chunk)
        in_mode = cols.mode_is(self._modes)
        is_step = cols.kind_is(STEP)
        for key, rows in cols.groups(is_step & in_mode):
            gid = self._group_id(key)
            duration = cols.end[rows] - cols.start[rows]
            self._steps.setdefault(gid, []).append((cols.step[rows], cols.start[rows], duration))
        # the time each step's own events spent per kind, keyed (group, step, kind)
        ctx = in_mode & ~is_step & (cols.step >= 0) & (cols.step < (1 << _STEP_BITS))
        if not ctx.any():
            return
        kind_code = np.full(len(cols.kinds), _OTHER, np.int64)
        for i, k in enumerate(cols.kinds):
            if k in CONTEXT_KINDS:
                kind_code[i] = CONTEXT_KINDS.index(k)
        for key, rows in cols.groups(ctx):
            gid = self._group_id(key)
            keys = ((np.int64(gid) << (_STEP_BITS + _KIND_BITS)) | (cols.step[rows] << _KIND_BITS)
                    | kind_code[cols.kind[rows]])
            self._ctx_keys.append(keys)
            self._ctx_us.append(np.maximum(cols.end[rows] - cols.start[rows], 0))
        if len(self._ctx_keys) > 64:
            self._compact_context()

    def _compact_context(self) -> tuple[np.ndarray, np.ndarray]:
        keys, us = _sum_by_key(_concat(self._ctx_keys), _concat(self._ctx_us))
        self._ctx_keys, self._ctx_us = [keys], [us]
        return keys, us

    def _series(self, gid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = self._steps[gid]
        steps, starts, durs = (_concat([p[i] for p in parts]) for i in range(3))
        order = np.lexsort((starts, steps))
        steps, starts, durs = steps[order], starts[order], durs[order]
        self._steps[gid] = [(steps, starts, durs)]
        return steps, starts, durs

    def result(self) -> RuleResult:
        if self._events == 0:
            return self.not_applicable("no framework data: the job recorded no steps (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        if not self._steps:
            which = f"{self.params['mode']} " if self.params["mode"] else ""
            return self.not_applicable(f"no {which}steps in the framework data")
        ctx_keys, ctx_us = self._compact_context()
        k = float(self.params["stddev"])
        limit = self.params["n_outliers"]
        names = {gid: key for key, gid in self._gid.items()}
        order = sorted(self._steps, key=lambda g: (names[g][0], names[g][1], mode_order(names[g][2])))
        details: dict[str, Any] = {}
        triggered = violations = datapoints = 0
        phase_us: dict[str, int] = {}
        kinds_us = np.zeros(len(_CONTEXT_NAMES), np.int64)
        for gid in order:
            node, rank, mode = names[gid]
            steps, starts, durs = self._series(gid)
            seconds = durs / US
            mean, std = float(seconds.mean()), float(seconds.std())
            outlier = seconds > mean + k * std
            n_out = int(outlier.sum())
            fires = n_out > limit
            datapoints += len(seconds)
            per_kind = _context_per_step(ctx_keys, ctx_us, gid, steps)  # steps × kinds, µs
            outside = np.clip(durs - per_kind.sum(axis=1), 0, None)
            per_kind = np.column_stack([per_kind, outside.astype(per_kind.dtype)])
            listed = np.flatnonzero(outlier)
            if listed.size > MAX_LISTED:
                slowest = listed[np.argsort(-durs[listed], kind="stable")[:MAX_LISTED]]
                listed = np.sort(slowest)
            p99, p95, p50 = np.percentile(seconds, [99, 95, 50])
            entry = {
                "node": node, "rank": rank, "phase": mode,
                "steps": int(len(seconds)),
                "step_stats": {"mean": mean, "max": float(seconds.max()), "p99": float(p99), "p95": float(p95),
                               "p50": float(p50), "min": float(seconds.min())},
                "number_of_outliers": n_out,
                "stddev": std,
                "outlier_threshold": mean + k * std,
                "triggered": bool(fires),
                **histogram(seconds[~outlier], bins=HISTOGRAM_BINS),
                "step_numbers": steps[listed].tolist(),
                "outliers": seconds[listed].tolist(),
                "outlier_start_us": starts[listed].tolist(),
                "outliers_listed": int(listed.size),
                "framework_context": {
                    "outlier_steps": _mean_per_kind(per_kind[outlier]),
                    "normal_steps": _mean_per_kind(per_kind[~outlier]),
                },
            }
            details[rank_key(node, rank, mode)] = entry
            if fires:
                triggered += 1
                violations += n_out
                phase_us[mode] = phase_us.get(mode, 0) + int(durs[outlier].sum())
                kinds_us += per_kind[outlier].sum(axis=0)
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


def _sum_by_key(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys and the (exact, integer) sum of the values of each."""
    if keys.size == 0:
        return keys, values
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[first], np.add.reduceat(values, first)


def _context_per_step(keys: np.ndarray, us: np.ndarray, gid: int, steps: np.ndarray) -> np.ndarray:
    """steps × context kinds: µs the events of each step spent per kind (0 where none was recorded)."""
    recorded = len(_CONTEXT_NAMES) - 1  # the last column, outside_phases, is derived by the caller
    out = np.zeros((len(steps), recorded), np.int64)
    if keys.size == 0 or steps.size == 0:
        return out
    ok = (steps >= 0) & (steps < (1 << _STEP_BITS))
    base = (np.int64(gid) << (_STEP_BITS + _KIND_BITS)) | (np.where(ok, steps, 0) << _KIND_BITS)
    for kind in range(recorded):
        want = base | kind
        pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
        hit = ok & (keys[pos] == want)
        out[hit, kind] = us[pos[hit]]
    return out


def _mean_per_kind(per_kind: np.ndarray) -> dict[str, float]:
    """Mean seconds per step in each kind (kinds never seen are left out)."""
    if len(per_kind) == 0:
        return {}
    sums = per_kind.sum(axis=0)
    return {n: float(s) / len(per_kind) / US for n, s in zip(_CONTEXT_NAMES, sums) if s > 0}


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
    description = ("Checks if the time spent on initialization exceeds a threshold percent of the total training "
                   "time. The rule waits until the first step of training loop starts. The initialization can take "
                   "longer if downloading the entire dataset from Amazon S3 in File mode. The default threshold is "
                   "20 minutes.")
    recommendation = ("Initialization takes too long. "
                      "If using File mode, consider switching to Pipe mode in case you are using TensorFlow framework.")
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
        table = chunk.framework
        if table is None or table.num_rows == 0:
            return
        self._events += table.num_rows
        cols = framework_columns(chunk)
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
            recommendation = (f"The first training step {what} {waited / 60 / US:.1f} minutes after the job started "
                              f"(threshold {self.params['threshold']} minutes). " + self.recommendation +
                              " Download or preprocess the dataset ahead of the job, stream it instead of copying "
                              "it whole, or cache it between runs.")
        return self.make_result(triggered=int(fires), violations=int(fires), datapoints=self._steps,
                                details=details, message=message, recommendation=recommendation)


def _node_starts(run: dict[str, Any], first_steps: dict[str, int]) -> dict[str, dict[str, Any]]:
    nodes = run.get("nodes") or {}
    out = {}
    for node in sorted(set(nodes) | set(first_steps)):
        start = (nodes.get(node) or {}).get("start_us")
        first = first_steps.get(node)
        out[node] = {"start_us": start, "first_step": first,
                     "initialization_s": (first - start) / US if first is not None and start is not None else None}
    return out
