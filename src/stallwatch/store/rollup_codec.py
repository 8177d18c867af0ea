"""Rollups as bytes: per aligned time bucket, the count / min / max / mean of every system series and the count /
total / shortest / longest of every framework event kind, so a long run's overview reads kilobytes instead of
every sample. The kernels are the format's own (the sampler writes them, readers rebuild them for older runs);
docs/format.md documents the columns. Decoding checks every column's type: a rollup is untrusted input."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stallwatch.records import COLUMN_SEP, LOOP, LOSS, OVERHEAD, TIMESTAMP, UNTIMED

S = 1_000_000
# 10 s for ranges of ~2-18 h at a chart's 650 points, 1 min up to ~4 days, 10 min beyond; below ~2 h raw is cheap.
SYSTEM_LEVELS_US = (10 * S, 60 * S, 600 * S)
FRAMEWORK_LEVEL_US = 60 * S  # steps and phases per minute: progress, totals and step time over a day
MARKERS = (LOOP, LOSS, OVERHEAD, UNTIMED)  # rare events kept with their name and args: how steps were found, what
# was lost, what stallwatch cost; `untimed` (one a second while steps are sampled) summed per minute and mode
STATS = ("min", "max", "mean", "n")
SYSTEM_KEYS = ("level_us", "bucket_us", "count", "first_us", "last_us", "gap_us", "gap_end_us")
FRAMEWORK_SCHEMA = pa.schema([
    pa.field("bucket_us", pa.int64()), pa.field("kind", pa.string()), pa.field("mode", pa.string()),
    pa.field("in_step", pa.bool_()), pa.field("count", pa.int64()), pa.field("sum_us", pa.int64()),
    pa.field("min_us", pa.int64()), pa.field("max_us", pa.int64()), pa.field("first_us", pa.int64()),
    pa.field("last_us", pa.int64()), pa.field("min_step", pa.int64()), pa.field("max_step", pa.int64()),
    pa.field("name", pa.string()), pa.field("args", pa.string()),
])


class RollupError(ValueError):
    """A rollup file that is not one (damaged, truncated or of the wrong types)."""


def stat_column(stat: str, series: str) -> str:
    """`min:cpu/cpu_util`: a statistic of one `device/metric` series."""
    return f"{stat}:{series}"


def series_names(table: pa.Table) -> list[str]:
    return [c[5:] for c in table.column_names if c.startswith("mean:")]


# -- system ------------------------------------------------------------------------------------------------------
def system_rows(ts: np.ndarray, values: np.ndarray, names: list[str],
                levels: tuple[int, ...] = SYSTEM_LEVELS_US) -> pa.Table:
    """Rollup rows of snapshots (`ts` µs, `values` snapshots × series, NaN where missing) at each level: per
    bucket the snapshots' count, first and last time and longest gap between two of them inside the bucket,
    and per series its min, max, mean and number of values."""
    ts = np.asarray(ts, np.int64)
    values = np.asarray(values, np.float64).reshape(len(ts), len(names))
    if len(ts) > 1 and np.any(ts[1:] < ts[:-1]):
        order = np.argsort(ts, kind="stable")
        ts, values = ts[order], values[order]
    tables = [_system_level(ts, values, names, level) for level in levels if len(ts)]
    return pa.concat_tables(tables) if tables else empty_system(names)


def _system_level(ts: np.ndarray, values: np.ndarray, names: list[str], level: int) -> pa.Table:
    bucket = ts // level * level
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    ends = np.r_[starts[1:], len(ts)]
    step = np.r_[0, np.diff(ts)]
    step[starts] = 0
    valid = ~np.isnan(values)
    n = np.add.reduceat(valid, starts, axis=0)
    total = np.add.reduceat(np.where(valid, values, 0.0), starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, total / np.maximum(n, 1), np.nan)
    gap = np.maximum.reduceat(step, starts).astype(np.int64)
    cols: dict[str, Any] = {
        "level_us": np.full(len(starts), level, np.int64), "bucket_us": bucket[starts],
        "count": (ends - starts).astype(np.int64), "first_us": ts[starts], "last_us": ts[ends - 1],
        "gap_us": gap, "gap_end_us": ts[_first_where(step, gap, starts)]}
    lo = np.fmin.reduceat(values, starts, axis=0)
    hi = np.fmax.reduceat(values, starts, axis=0)
    for i, name in enumerate(names):
        cols[stat_column("min", name)] = lo[:, i].astype(np.float32)
        cols[stat_column("max", name)] = hi[:, i].astype(np.float32)
        cols[stat_column("mean", name)] = mean[:, i].astype(np.float32)
        cols[stat_column("n", name)] = n[:, i].astype(np.int32)
    return pa.table(cols)


def _first_where(values: np.ndarray, group_max: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per group (rows from each of `starts`), the index of its first row holding the group's maximum."""
    group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(values)]))
    hits = np.flatnonzero(values == group_max[group])
    first = np.r_[True, group[hits[1:]] != group[hits[:-1]]]
    return hits[first]


def empty_system(names: list[str]) -> pa.Table:
    return pa.table({**{k: pa.array([], pa.int64()) for k in SYSTEM_KEYS},
                     **{stat_column(s, n): pa.array([], pa.int32() if s == "n" else pa.float32())
                        for n in names for s in STATS}})


def combine_system(tables: list[pa.Table]) -> pa.Table:
    """Several rollups of one node as one, time-ordered: rows of the same level and bucket (a bucket split by a
    segment boundary) merged — counts added, min of mins, max of maxes, means weighted by their counts."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty_system([])
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    order = pc.sort_indices(table, [("level_us", "ascending"), ("bucket_us", "ascending")])
    table = table.take(order)
    level, bucket = table["level_us"].to_numpy(), table["bucket_us"].to_numpy()
    if len(level) < 2 or not np.any((level[1:] == level[:-1]) & (bucket[1:] == bucket[:-1])):
        return _filled(table)
    starts = np.flatnonzero(np.r_[True, (level[1:] != level[:-1]) | (bucket[1:] != bucket[:-1])])
    out: dict[str, Any] = {"level_us": level[starts], "bucket_us": bucket[starts]}
    out["count"] = np.add.reduceat(table["count"].to_numpy(), starts)
    out["first_us"] = np.minimum.reduceat(table["first_us"].to_numpy(), starts)
    out["last_us"] = np.maximum.reduceat(table["last_us"].to_numpy(), starts)
    gaps = table["gap_us"].to_numpy()
    out["gap_us"] = np.maximum.reduceat(gaps, starts)
    out["gap_end_us"] = table["gap_end_us"].to_numpy()[_first_where(gaps, out["gap_us"], starts)]
    for name in series_names(table):
        n = _ints(table[stat_column("n", name)])
        mean = _floats(table[stat_column("mean", name)])
        weight = np.add.reduceat(np.where(n > 0, np.nan_to_num(mean) * n, 0.0), starts)
        total_n = np.add.reduceat(n, starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[stat_column("mean", name)] = np.where(total_n > 0, weight / np.maximum(total_n, 1), np.nan
                                                      ).astype(np.float32)
        out[stat_column("min", name)] = np.fmin.reduceat(_floats(table[stat_column("min", name)]), starts)
        out[stat_column("max", name)] = np.fmax.reduceat(_floats(table[stat_column("max", name)]), starts)
        out[stat_column("n", name)] = total_n.astype(np.int32)
    return pa.table(out)


def _filled(table: pa.Table) -> pa.Table:
    """Series a file lacked (nulls after concatenation) as NaN and n = 0."""
    if not any(table[c].null_count for c in table.column_names):
        return table
    cols = {}
    for c in table.column_names:
        cols[c] = _ints(table[c]) if c.startswith("n:") else _floats(table[c]) if ":" in c else table[c]
    return pa.table(cols)


def _floats(col: pa.ChunkedArray) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False).astype(np.float32) if col.null_count == 0 else \
        pc.fill_null(col.cast(pa.float32()), np.nan).to_numpy(zero_copy_only=False)


def _ints(col: pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)


# -- framework ---------------------------------------------------------------------------------------------------
def framework_rows(events: pa.Table, level: int = FRAMEWORK_LEVEL_US) -> pa.Table:
    """Rollup rows of one rank's events (kind, name, mode, step, start_us, end_us, args), bucketed by start: per
    (bucket, kind, mode, whether inside a step) the count, total / shortest / longest duration, earliest start,
    latest end and step range; markers (`MARKERS`) kept one row each, with their name and args, except `untimed`
    ones: one row per minute and mode whose args add up theirs (`_untimed_rows`)."""
    if events.num_rows == 0:
        return FRAMEWORK_SCHEMA.empty_table()
    kind = events["kind"].cast(pa.string())
    start = events["start_us"]
    table = pa.table({
        "bucket_us": pc.multiply(pc.divide(start, pa.scalar(level, pa.int64())), pa.scalar(level, pa.int64())),
        "kind": kind, "mode": events["mode"].cast(pa.string()), "in_step": pc.is_valid(events["step"]),
        "dur": pc.subtract(events["end_us"], start), "start_us": start, "end_us": events["end_us"],
        "step": events["step"], "name": events["name"].cast(pa.string()), "args": events["args"]})
    marker = pc.is_in(kind, pa.array(MARKERS, pa.string()))
    grouped = table.filter(pc.invert(marker)).group_by(["bucket_us", "kind", "mode", "in_step"]).aggregate([
        ("dur", "count"), ("dur", "sum"), ("dur", "min"), ("dur", "max"), ("start_us", "min"), ("end_us", "max"),
        ("step", "min"), ("step", "max")])
    rows = _framework_table(grouped, "dur_count", "dur_sum", "dur_min", "dur_max", "start_us_min", "end_us_max",
                            "step_min", "step_max")
    marks = table.filter(pc.and_(marker, pc.not_equal(kind, UNTIMED)))
    marks = pa.table({"bucket_us": marks["bucket_us"], "kind": marks["kind"], "mode": marks["mode"],
                      "in_step": marks["in_step"], "count": pa.array(np.ones(marks.num_rows, np.int64)),
                      "sum_us": marks["dur"], "min_us": marks["dur"], "max_us": marks["dur"],
                      "first_us": marks["start_us"], "last_us": marks["end_us"], "min_step": marks["step"],
                      "max_step": marks["step"], "name": marks["name"], "args": marks["args"]},
                     schema=FRAMEWORK_SCHEMA)
    return pa.concat_tables([rows, marks, _untimed_rows(table.filter(pc.equal(kind, UNTIMED)))]) \
        .sort_by([("bucket_us", "ascending")])


UNTIMED_FIELDS = ("steps", "stretches", "us")


def _untimed_rows(table: pa.Table) -> pa.Table:
    """`untimed` markers summed per minute and mode: their args' counts added (read with a pattern, a value that
    is not a plain count reads as 0: the args come from the job), `count` the markers."""
    if not table.num_rows:
        return FRAMEWORK_SCHEMA.empty_table()
    values = {f: pc.fill_null(pc.cast(pc.struct_field(pc.extract_regex(
        pc.fill_null(table["args"], ""), rf'"{f}": ?(?P<v>[0-9]{{1,15}})[,}}]'), [0]), pa.int64()), 0)
        for f in UNTIMED_FIELDS}
    parts = pa.table({"bucket_us": table["bucket_us"], "mode": table["mode"], "start_us": table["start_us"],
                      "end_us": table["end_us"], **values})
    g = parts.group_by(["bucket_us", "mode"]).aggregate(
        [("start_us", "count"), ("start_us", "min"), ("end_us", "max"), *((f, "sum") for f in UNTIMED_FIELDS)])
    pieces = [piece for i, f in enumerate(UNTIMED_FIELDS)
              for piece in (f'{", " if i else "{"}"{f}": ', pc.cast(g[f"{f}_sum"], pa.string()))]
    args = pc.binary_join_element_wise(*pieces, "}", "")
    n = g.num_rows
    return pa.table({
        "bucket_us": g["bucket_us"], "kind": pa.array([UNTIMED] * n, pa.string()), "mode": g["mode"],
        "in_step": pa.array([False] * n), "count": g["start_us_count"],
        "sum_us": g["us_sum"], "min_us": pa.nulls(n, pa.int64()), "max_us": pa.nulls(n, pa.int64()),
        "first_us": g["start_us_min"], "last_us": g["end_us_max"], "min_step": pa.nulls(n, pa.int64()),
        "max_step": pa.nulls(n, pa.int64()), "name": pa.array(["steps"] * n, pa.string()),
        "args": args}, schema=FRAMEWORK_SCHEMA)


def combine_framework(tables: list[pa.Table]) -> pa.Table:
    """One rank's rollups as one: groups split by a segment boundary merged, markers kept as they are."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return FRAMEWORK_SCHEMA.empty_table()
    if len(tables) == 1:  # one file's rows are grouped already
        return tables[0]
    table = pa.concat_tables(tables)
    marker = pc.is_in(table["kind"], pa.array(MARKERS, pa.string()))
    grouped = table.filter(pc.invert(marker)).group_by(["bucket_us", "kind", "mode", "in_step"]).aggregate([
        ("count", "sum"), ("sum_us", "sum"), ("min_us", "min"), ("max_us", "max"), ("first_us", "min"),
        ("last_us", "max"), ("min_step", "min"), ("max_step", "max")])
    rows = _framework_table(grouped, "count_sum", "sum_us_sum", "min_us_min", "max_us_max", "first_us_min",
                            "last_us_max", "min_step_min", "max_step_max")
    return pa.concat_tables([rows, table.filter(marker)]).sort_by([("bucket_us", "ascending")])


def _framework_table(g: pa.Table, *names: str) -> pa.Table:
    n = g.num_rows
    cols = [g["bucket_us"], g["kind"], g["mode"], g["in_step"], *[g[x] for x in names],
            pa.nulls(n, pa.string()), pa.nulls(n, pa.string())]
    return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(cols, FRAMEWORK_SCHEMA)], schema=FRAMEWORK_SCHEMA)


# -- bytes -------------------------------------------------------------------------------------------------------
def encode(table: pa.Table) -> bytes:
    """Parquet (zstd); a system rollup gets one row group per level, so a reader decodes only the level it asks."""
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema, compression="zstd") as writer:
        if "level_us" in table.column_names:
            levels = table["level_us"].to_numpy()
            for level in np.unique(levels):
                writer.write_table(table.filter(pa.array(levels == level)), row_group_size=1 << 30)
        else:
            writer.write_table(table, row_group_size=1 << 30)
    return sink.getvalue()


def decode_system(source: Any, level: int | None = None, metrics: frozenset[str] | None = None) -> pa.Table:
    """A system rollup file's rows (of `level` only, when given; of the series of `metrics` only, when given: a
    node's 10 s level holds hundreds of columns and a question needs a few). RollupError when it is not one."""
    try:
        pf = pq.ParquetFile(source)
        schema = pf.schema_arrow  # built anew on each access: once per file
        groups = [i for i in range(pf.num_row_groups)
                  if level is None or _group_level(pf, schema.get_field_index("level_us"), i) in (level, None)]
        columns = None if metrics is None else system_columns(schema.names, metrics)
        table = pf.read_row_groups(groups, columns=columns) if groups else schema.empty_table()
    except Exception as exc:
        raise RollupError(f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})") \
            from None
    for key in SYSTEM_KEYS:
        if key not in table.column_names or table[key].type != pa.int64():
            raise RollupError(f"its column {key!r} is missing or not int64")
    for c in table.column_names:
        if ":" in c and (c.split(":", 1)[0] not in STATS or not (pa.types.is_floating(table[c].type)
                                                               or pa.types.is_integer(table[c].type))):
            raise RollupError(f"its column {c!r} is not a numeric statistic")
    if TIMESTAMP in table.column_names or not set(table["level_us"].to_pylist()) <= set(SYSTEM_LEVELS_US):
        raise RollupError("its levels are not 10 s, 1 min or 10 min")
    if level is not None:
        table = table.filter(pc.equal(table["level_us"], level))
    return table


def system_columns(names: list[str], metrics: frozenset[str]) -> list[str]:
    """Of a system rollup's columns, the buckets' own and the statistics of the series of `metrics`."""
    return [c for c in names if c in SYSTEM_KEYS or (":" in c and c.split(":", 1)[1].partition(COLUMN_SEP)[2]
                                                     in metrics)]


def _group_level(pf: pq.ParquetFile, col: int, i: int) -> int | None:
    """A row group's level from its statistics (None when unknown: then it is read and filtered)."""
    try:
        stats = pf.metadata.row_group(i).column(col).statistics
        return int(stats.min) if stats is not None and stats.has_min_max and stats.min == stats.max else None
    except Exception:
        return None


def decode_framework(source: Any) -> pa.Table:
    """A framework rollup file's rows. RollupError when it is not one."""
    try:
        table = pq.ParquetFile(source).read(use_threads=False)  # not read_table: its dataset layer costs 5 ms a file
    except Exception as exc:
        raise RollupError(f"unreadable ({type(exc).__name__})") from None
    for f in FRAMEWORK_SCHEMA:
        if f.name not in table.column_names or table[f.name].type != f.type:
            raise RollupError(f"its column {f.name!r} is missing or not {f.type}")
    return table.select(FRAMEWORK_SCHEMA.names)
