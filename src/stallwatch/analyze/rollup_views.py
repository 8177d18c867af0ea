"""A long run's overview from its rollups (store.rollups) instead of every sample and event: a node's chart
series at a coarse bucket, its utilization, the steps per mode, the loop's span, the phases' shares, training
progress and the markers — what the dashboard's first charts need, in kilobytes. Counts, spans, shares, means and
maxima are exact; what a bucket hides is said where it is used (percentiles of bucket means, gaps per bucket)."""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch import records as r
from stallwatch.analyze.loss import SampleGap, gap_limits_us
from stallwatch.analyze.node_series import Band, NodeSeries
from stallwatch.analyze.step_window import EventBucket, buckets_of
from stallwatch.analyze.steps import LoopSpan, mode_order
from stallwatch.analyze.usage import USAGE_ROWS, UsageStat, _matches
from stallwatch.records import COLUMN_SEP, LOOP, LOSS, OVERHEAD, STEP, UNTIMED
from stallwatch.store.rollup_codec import FRAMEWORK_LEVEL_US, SYSTEM_LEVELS_US, series_names, stat_column


def pick_level(span_us: int, buckets: int, interval_ms: float | None) -> int | None:
    """The coarsest rollup level whose bucket still fits `buckets` over `span_us`; None when the range needs finer
    buckets than any level (then raw snapshots are read: a few hours at most)."""
    want = span_us / max(buckets, 1)
    fits = [level for level in SYSTEM_LEVELS_US if level <= want]
    return max(fits) if fits else None


def node_series(rows: pa.Table, node: str, start_us: int | None, end_us: int | None, buckets: int) -> NodeSeries:
    """NodeSeries from one node's rollup rows of one level: buckets merged (min of mins, max of maxes, means
    weighted by counts) onto at most `buckets` equal buckets, each a whole number of rollup buckets."""
    bucket = rows["bucket_us"].to_numpy()
    level = int(rows["level_us"][0].as_py()) if rows.num_rows else SYSTEM_LEVELS_US[0]
    keep = np.ones(len(bucket), bool)
    if start_us is not None:
        keep &= bucket + level > start_us
    if end_us is not None:
        keep &= bucket < end_us
    names = series_names(rows)
    devices = {n: n.partition(COLUMN_SEP) for n in names}
    cores = sorted({d for d, _, m in devices.values() if m == r.CPU_UTIL and _matches(d, "cpu*")}, key=_device_key)
    gpus = sorted({d for d, _, m in devices.values() if m == r.GPU_UTIL and _matches(d, "gpu*")}, key=_device_key)
    idx = np.flatnonzero(keep)
    if not len(idx):
        return NodeSeries(node, start_us, end_us, 0, np.empty(0, np.int64), {}, cores, gpus, 0, False)
    b = bucket[idx]
    lo = int(b[0]) if start_us is None else max(int(b[0]), start_us // level * level)
    hi = int(b[-1]) + level
    width = max(level, -(-(hi - lo) // max(buckets, 1)) // level * level)
    width = width if (hi - lo) / width <= buckets else width + level
    group = (b - lo) // width
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    ts = lo + group[starts] * width

    def band(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = rows[stat_column("n", name)].to_numpy(zero_copy_only=False)[idx].astype(np.float64)
        mean = rows[stat_column("mean", name)].to_numpy(zero_copy_only=False)[idx].astype(np.float64)
        total = np.add.reduceat(np.where(n > 0, np.nan_to_num(mean) * n, 0.0), starts)
        count = np.add.reduceat(n, starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            m = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        mn = np.fmin.reduceat(rows[stat_column("min", name)].to_numpy(zero_copy_only=False)[idx], starts)
        mx = np.fmax.reduceat(rows[stat_column("max", name)].to_numpy(zero_copy_only=False)[idx], starts)
        return mn.astype(np.float32), mx.astype(np.float32), m.astype(np.float32), count

    series: dict[str, Band] = {}
    for out, device, metric, scale in (("cpu", r.CPU, r.CPU_UTIL, 1.0), ("iowait", r.CPU, r.CPU_IOWAIT, 1.0),
                                       ("memory", r.MEMORY, r.MEM_UTIL, 1.0), ("net_rx", r.NET, r.NET_RX_BPS, 1e6),
                                       ("net_tx", r.NET, r.NET_TX_BPS, 1e6)):
        name = f"{device}{COLUMN_SEP}{metric}"
        if name in devices:
            mn, mx, m, _ = band(name)
            series[out] = Band(mn / np.float32(scale), mx / np.float32(scale), m / np.float32(scale))
    for core in cores:
        mn, mx, m, _ = band(f"{core}{COLUMN_SEP}{r.CPU_UTIL}")
        series[core] = Band(mn, mx, m)
    per_gpu: dict[str, list[Band]] = {"util": [], "mem": []}
    for gpu in gpus:
        mn, mx, m, _ = band(f"{gpu}{COLUMN_SEP}{r.GPU_UTIL}")
        series[gpu] = Band(mn, mx, m)
        per_gpu["util"].append(series[gpu])
        mem = f"{gpu}{COLUMN_SEP}{r.GPU_MEM_UTIL}"
        if mem in devices:
            mn, mx, m, _ = band(mem)
            series[f"{gpu}_mem"] = Band(mn, mx, m)
            per_gpu["mem"].append(series[f"{gpu}_mem"])
    if per_gpu["util"]:
        # Across GPUs from each GPU's bucket statistics: the mean of their means (and of their mins and maxes),
        # the least and the most busy GPU by bucket mean.
        stack = {k: np.vstack([getattr(b, k) for b in per_gpu["util"]]) for k in ("min", "max", "mean")}
        with np.errstate(invalid="ignore"), _quiet():
            series["gpu"] = Band(*(np.nanmean(stack[k], axis=0).astype(np.float32) for k in ("min", "max", "mean")))
            series["gpu_lo"] = Band(np.nanmin(stack["min"], axis=0), np.nanmin(stack["max"], axis=0),
                                    np.nanmin(stack["mean"], axis=0))
            series["gpu_hi"] = Band(np.nanmax(stack["min"], axis=0), np.nanmax(stack["max"], axis=0),
                                    np.nanmax(stack["mean"], axis=0))
        if per_gpu["mem"]:
            mstack = {k: np.vstack([getattr(b, k) for b in per_gpu["mem"]]) for k in ("min", "max", "mean")}
            with np.errstate(invalid="ignore"), _quiet():
                series["gpu_mem"] = Band(*(np.nanmean(mstack[k], axis=0).astype(np.float32)
                                           for k in ("min", "max", "mean")))
    snapshots = int(rows["count"].to_numpy()[idx].sum())
    return NodeSeries(node, start_us, end_us, int(width), ts.astype(np.int64), series, cores, gpus, snapshots, False)


def usage(node: str, rows: pa.Table) -> list[UsageStat]:
    """The utilization table from one node's finest rollup: mean and max exact, p50 / p95 over the buckets' means
    (a spike shorter than a bucket counts in the max, not in the percentiles); the busiest core per bucket."""
    names = series_names(rows)
    out: list[UsageStat] = []
    for label, selector, metric, unit in USAGE_ROWS:
        picked = [n for n in names if n.partition(COLUMN_SEP)[2] == metric
                  and _matches(n.partition(COLUMN_SEP)[0], selector)]
        if not picked:
            continue
        n = np.column_stack([rows[stat_column("n", p)].to_numpy(zero_copy_only=False) for p in picked]).astype(float)
        mean = np.column_stack([rows[stat_column("mean", p)].to_numpy(zero_copy_only=False) for p in picked])
        peak = np.column_stack([rows[stat_column("max", p)].to_numpy(zero_copy_only=False) for p in picked])
        if label == "CPU busiest core":
            has = (n > 0).any(axis=1)
            if not has.any():
                continue
            with _quiet():
                means = np.nanmax(mean[has], axis=1)
                top = float(np.nanmax(peak[has]))
            weights, count = n[has].max(axis=1), int(n[has].max(axis=1).sum())
        else:
            has = n > 0
            if not has.any():
                continue
            means, weights, count = mean[has], n[has], int(n.sum())
            with _quiet():
                top = float(np.nanmax(peak))
        avg = float(np.average(means, weights=weights))
        p50, p95 = _weighted_percentiles(means, weights, (50, 95))
        out.append(UsageStat(node, label, unit, avg, p50, p95, top, count))
    return out


def sample_gaps(node: str, rows: pa.Table, interval_ms: float | None,
                changes: list[tuple[int, float]] | None = None) -> list[SampleGap]:
    """Stretches without snapshots longer than the loss rule's limit, from the finest rollup: between buckets
    exactly, inside a bucket its longest one; each judged against the intervals in force at its ends."""
    if not rows.num_rows:
        return []
    first, last = rows["first_us"].to_numpy(), rows["last_us"].to_numpy()
    gap, gap_end = rows["gap_us"].to_numpy(), rows["gap_end_us"].to_numpy()
    between = gap_limits_us(last[:-1], first[1:], interval_ms, changes)
    inside = gap_limits_us(gap_end - gap, gap_end, interval_ms, changes)
    out = []
    for i in range(len(first)):
        if i and first[i] - last[i - 1] > between[i - 1]:
            out.append(SampleGap(node, int(last[i - 1]), int(first[i])))
        if gap[i] > inside[i]:
            out.append(SampleGap(node, int(gap_end[i] - gap[i]), int(gap_end[i])))
    return out


def sample_interval_ms(rows: pa.Table) -> float | None:
    """The median spacing of snapshots, from the buckets' counts and spans."""
    if not rows.num_rows:
        return None
    count, span = rows["count"].to_numpy(), rows["last_us"].to_numpy() - rows["first_us"].to_numpy()
    ok = count > 1
    return float(np.median(span[ok] / (count[ok] - 1)) / 1000) if ok.any() else None


# -- framework ---------------------------------------------------------------------------------------------------
def steps_per_mode(fw: pa.Table) -> dict[str, int]:
    steps = fw.filter(pc.equal(fw["kind"], STEP))
    counts: dict[str, int] = {}
    for row in steps.group_by("mode").aggregate([("count", "sum")]).to_pylist():
        if row["count_sum"]:
            counts[str(row["mode"])] = int(row["count_sum"])
    return dict(sorted(counts.items(), key=lambda kv: (mode_order(kv[0]), kv[0])))


def loop_span(fw: pa.Table) -> LoopSpan | None:
    steps = fw.filter(pc.equal(fw["kind"], STEP))
    if not steps.num_rows:
        return None
    return LoopSpan(int(pc.min(steps["first_us"]).as_py()), int(pc.max(steps["last_us"]).as_py()),
                    int(pc.sum(steps["count"]).as_py()))


def phase_shares(fw: pa.Table, modes: tuple[str, ...], phases: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per mode, each phase's share of the mode's step time, % (phases inside steps only), as compare.phase_shares."""
    out: dict[str, dict[str, float]] = {}
    totals = {(str(x["kind"]), str(x["mode"]), bool(x["in_step"])): int(x["sum_us_sum"] or 0)
              for x in fw.group_by(["kind", "mode", "in_step"]).aggregate([("sum_us", "sum")]).to_pylist()}
    for mode in modes:
        total = sum(v for (k, m, _), v in totals.items() if k == STEP and m == mode)
        if total <= 0:
            continue
        out[mode] = {p: 100.0 * totals.get((p, mode, True), 0) / total for p in phases}
    return out


def progress(fw: pa.Table, points: int = 200) -> dict[str, list[int]]:
    """Training steps done over time (all ranks, by the minute they started), at most `points` points."""
    steps = fw.filter(pc.equal(fw["kind"], STEP))
    if not steps.num_rows:
        return {"t": [], "steps": []}
    per = steps.group_by("bucket_us").aggregate([("count", "sum"), ("last_us", "max")]).sort_by("bucket_us")
    done = np.cumsum(per["count_sum"].to_numpy())
    ends = per["last_us_max"].to_numpy()
    idx = np.unique(np.linspace(0, len(done) - 1, min(points, len(done))).astype(np.int64))
    return {"t": ends[idx].tolist(), "steps": done[idx].tolist()}


def markers(fw: pa.Table) -> pa.Table:
    """The marker events (loop, loss, overhead, untimed) as `Run.framework(kinds=[...])` returns them."""
    m = fw.filter(pc.is_in(fw["kind"], pa.array([LOOP, LOSS, OVERHEAD, UNTIMED], pa.string())))
    return pa.table({"node": m["node"], "rank": m["rank"], "kind": m["kind"], "name": m["name"], "mode": m["mode"],
                     "start_us": m["first_us"], "end_us": m["last_us"], "args": m["args"]})


def node_step_start(fw: pa.Table, node: str, steps: int) -> int | None:
    """The start of the minute from which `node` holds at least `steps` steps (the last steps' reading start)."""
    mine = fw.filter(pc.and_(pc.equal(fw["node"], node), pc.equal(fw["kind"], STEP)))
    if not mine.num_rows:
        return None
    per = mine.group_by("bucket_us").aggregate([("count", "sum")]).sort_by([("bucket_us", "descending")])
    done = np.cumsum(per["count_sum"].to_numpy())
    at = int(np.searchsorted(done, steps))
    return int(per["bucket_us"][min(at, per.num_rows - 1)].as_py())


def event_totals(fw: pa.Table, node: str, kinds: tuple[str, ...]) -> tuple[dict[str, tuple[int, float]], int, int]:
    """Per kind, (events, seconds) of `node` over the whole run; its steps and all its events of `kinds`."""
    mine = fw.filter(pc.and_(pc.equal(fw["node"], node), pc.is_in(fw["kind"], pa.array(list(kinds), pa.string()))))
    out = {}
    for row in mine.group_by("kind").aggregate([("count", "sum"), ("sum_us", "sum")]).to_pylist():
        out[str(row["kind"])] = (int(row["count_sum"]), float(row["sum_us_sum"] or 0) / 1e6)
    return out, out.get(STEP, (0, 0.0))[0], sum(v[0] for v in out.values())


def event_buckets(fw: pa.Table, node: str, kinds: tuple[str, ...]) -> list[EventBucket]:
    """The node's steps per rollup bucket (a minute), all ranks: count, mean step and phases per step."""
    mine = fw.filter(pc.and_(pc.equal(fw["node"], node), pc.is_in(fw["kind"], pa.array(list(kinds), pa.string()))))
    if not mine.num_rows:
        return []
    g = mine.group_by(["bucket_us", "kind"]).aggregate([("count", "sum"), ("sum_us", "sum")])
    return buckets_of(g["bucket_us"].to_numpy(), g["kind"].to_numpy(zero_copy_only=False).astype(str),
                      g["sum_us_sum"].to_numpy(), g["count_sum"].to_numpy(), FRAMEWORK_LEVEL_US)


def bucket_count(fw: pa.Table, node: str) -> int:
    """How many rollup buckets (minutes) hold the node's framework events."""
    return len(pc.unique(fw.filter(pc.equal(fw["node"], node))["bucket_us"])) if fw.num_rows else 0


def latest_step(fw: pa.Table) -> int | None:
    steps = fw.filter(pc.equal(fw["kind"], STEP))
    value = pc.max(steps["max_step"]).as_py() if steps.num_rows else None
    return None if value is None else int(value)


def _weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    order = np.argsort(values)  # ties are equal values: any order gives the same percentiles
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    return [float(v[min(int(np.searchsorted(cum, q / 100 * cum[-1])), len(v) - 1)]) for q in qs]


def _device_key(device: str) -> tuple[str, int]:
    digits = device.lstrip("abcdefghijklmnopqrstuvwxyz")
    return device[: len(device) - len(digits)], int(digits) if digits.isdigit() else -1


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """All-NaN slices are expected (a bucket no GPU reported in): no RuntimeWarning for them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield
