"""The run over time, as analyses: each node's system metrics as peak-keeping downsampled lines, the training
phases (initialization, training, evaluation, finalization) merged from the step events, and the moments the
rules flagged (bottleneck ranges, flagged windows, outlier steps). What the report's timeline, the notebook's
Timeline and the dashboard draw."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from stallwatch import catalogue, units
from stallwatch.analyze.downsample import minmax
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.batch_size import BatchSizeDetails
from stallwatch.analyze.rules.bottleneck import BottleneckDetails
from stallwatch.analyze.rules.gpu_memory_increase import GPUMemoryIncreaseDetails
from stallwatch.analyze.rules.low_gpu_utilization import LowGPUUtilizationDetails
from stallwatch.analyze.rules.step_outlier import StepOutlierDetails
from stallwatch.analyze.rules.system_usage import OverallSystemUsage
from stallwatch.analyze.series import Marker, Panel, Series, Span
from stallwatch.records import EVAL, GLOBAL, TRAIN
from stallwatch.timeutil import format_duration, format_us

# One read of the store serves the timeline, the heatmap and the node comparison: the metrics the system-usage
# rule reads.
METRICS = tuple(OverallSystemUsage.metrics)
POINT_BUDGET = 64_000  # points over all lines (≈ 12 bytes each): buckets per line = budget / (2 × lines)
MIN_BUCKETS, MAX_BUCKETS = 300, 2000
MAX_MARKERS = 500  # outlier steps drawn (the slowest); the rule lists at most 100 per rank and phase
PHASE_LABELS = {mode: catalogue.label(mode) for mode in (TRAIN, EVAL, GLOBAL)}
Rules = Mapping[str, RuleResult]


@dataclass(frozen=True)
class Metric:
    """A node-level series of the timeline: how to get it from a node's snapshots."""
    title: str
    y_label: str
    values: Callable[[Any], np.ndarray | None]
    percent: bool = True
    y_format: str = "0.0"


def _column(device: str, metric: str) -> Callable[[Any], np.ndarray | None]:
    return lambda frame: frame.get(device, metric)


def _gpu_mean(metric: str) -> Callable[[Any], np.ndarray | None]:
    def values(frame: Any) -> np.ndarray | None:
        gpus = frame.devices("gpu", metric)
        return _nanmean([frame.get(g, metric) for g in gpus]) if gpus else None
    return values


def _network(frame: Any) -> np.ndarray | None:
    rx, tx = frame.get("net", "net_rx_bps"), frame.get("net", "net_tx_bps")
    if rx is None and tx is None:
        return None
    parts = [x for x in (rx, tx) if x is not None]
    both = np.nansum(np.vstack(parts), axis=0) / 1e6
    both[np.all(np.isnan(np.vstack(parts)), axis=0)] = np.nan
    return both.astype(np.float32)


def _nanmean(columns: list[np.ndarray]) -> np.ndarray:
    """Per snapshot, the mean over the columns that have a value (NaN where none has)."""
    total = np.zeros(len(columns[0]), np.float64)
    count = np.zeros(len(columns[0]), np.int32)
    for x in columns:
        ok = ~np.isnan(x)
        total += np.where(ok, x, 0.0)
        count += ok
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan).astype(np.float32)


def _title(device: str, metric: str) -> str:
    entry = catalogue.metric(device, metric)
    assert entry is not None, (device, metric)
    return entry.title


TIMELINE_METRICS = (
    Metric(_title("cpu", "cpu_util"), "%", _column("cpu", "cpu_util")),
    # ... and the job's own share of it (its processes, as % of the host's cores): a busy host shows whose CPU it was
    Metric(_title("proc", "cpu_util"), "% of the host", _column("proc", "cpu_util")),
    Metric(_title("gpu0", "gpu_util"), "%", _gpu_mean("gpu_util")),
    Metric(_title("memory", "mem_util"), "% used", _column("memory", "mem_util")),
    Metric(_title("gpu0", "gpu_mem_util"), "% used", _gpu_mean("gpu_mem_util")),
    Metric(_title("cpu", "cpu_iowait"), "%", _column("cpu", "cpu_iowait"), percent=False, y_format="0.00"),
    Metric(catalogue.NETWORK_TOTAL.title, units.axis(catalogue.NETWORK_TOTAL.unit)[0], _network, percent=False,
           y_format="0.00"),
)


def buckets_for(lines: int) -> int:
    """Buckets per line so that every line together stays within POINT_BUDGET points."""
    return int(np.clip(POINT_BUDGET // max(1, 2 * lines), MIN_BUCKETS, MAX_BUCKETS))


def panels(frames: Mapping[str, Any] | Iterable[tuple[str, Any]],
           metrics: tuple[Metric, ...] = TIMELINE_METRICS) -> list[Panel]:
    """One panel per metric that some node has, one downsampled line per node. `frames` (node -> snapshots, or
    (node, snapshots) pairs made one at a time) are used one at a time: each line is first cut to `MAX_BUCKETS`
    peak-keeping buckets (`prepare_line`), so a long run's nodes are never all in memory."""
    items = frames.items() if isinstance(frames, Mapping) else frames
    raw: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {m.title: [] for m in metrics}
    for node, frame in items:
        if not len(frame):
            continue
        for metric in metrics:
            values = metric.values(frame)
            if values is not None and not np.all(np.isnan(values)):
                raw[metric.title].append((node, *prepare_line(frame.timestamps, values)))
    buckets = buckets_for(sum(len(lines) for lines in raw.values()))
    out = []
    for metric in metrics:
        lines = raw[metric.title]
        if lines:
            series = [Series(node, *minmax(ts, values, buckets)) for node, ts, values in lines]
            out.append(Panel(metric.title, metric.y_label, series, metric.y_format, metric.percent))
    return out


def prepare_line(ts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A line cut to `MAX_BUCKETS` min/max buckets, its first and last point kept so that the final, coarser
    cut spans the same time: the same as cutting the raw line where it has at most 2 × `MAX_BUCKETS` points
    (half an hour at 500 ms), else each final bucket's extremes are within one fine bucket of the raw ones."""
    cut_ts, cut_values = minmax(ts, values, MAX_BUCKETS)
    if len(cut_ts) == len(ts):
        return cut_ts, cut_values
    order = np.argsort(ts, kind="stable")
    first, last = order[0], order[-1]
    keep_ts = np.r_[ts[first], cut_ts, ts[last]]
    keep_values = np.r_[values[first], cut_values, values[last]]
    unique = np.r_[True, keep_ts[1:] != keep_ts[:-1]]
    return keep_ts[unique], keep_values[unique]


# -- training phases -------------------------------------------------------------------------------------


def merge_intervals(starts: np.ndarray, ends: np.ndarray, gap_us: int) -> list[tuple[int, int]]:
    """Intervals (in any order; fastest per rank, in time) merged where the next starts within `gap_us` of the
    previous end; runs are found vectorised, then the few runs are merged into a sorted union. Merging merged
    parts again gives the same union, so a run can be merged node by node, an hour at a time."""
    if len(starts) == 0:
        return []
    new = np.r_[True, (starts[1:] - ends[:-1] > gap_us) | (starts[1:] < starts[:-1])]
    first = np.flatnonzero(new)
    lo = starts[first]
    hi = np.maximum.reduceat(ends, first)
    order = np.argsort(lo, kind="stable")
    merged: list[list[int]] = []
    for a, b in zip(lo[order].tolist(), hi[order].tolist()):
        if merged and a - merged[-1][1] <= gap_us:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def phase_gap_us(median_step_us: float) -> int:
    """Steps of one mode further apart than this (10 median steps, at least 1 s) start a new stretch."""
    return max(1_000_000, int(10 * median_step_us))


def phase_spans(steps: FrameworkColumns, job_start: int | None, job_end: int | None,
                gaps_us: Mapping[str, int] | None = None) -> list[Span]:
    """Initialization (job start to the first step), the TRAIN / EVAL / GLOBAL stretches (steps of one mode
    with no pause longer than `gaps_us[mode]`, by default `phase_gap_us` of its median step, across all ranks)
    and finalization. `steps` holds step events only."""
    if steps.n == 0:
        return []
    start, end = steps.start, steps.end
    intervals = {}
    for mode in (TRAIN, EVAL, GLOBAL):
        sel = steps.mode_is([mode])
        if not sel.any():
            continue
        s, e = start[sel], end[sel]
        if gaps_us is not None and mode in gaps_us:
            gap = gaps_us[mode]
        else:
            gap = phase_gap_us(float(np.median((e - s)[:: max(1, int(sel.sum()) // 100_000)])))
        intervals[mode] = (merge_intervals(s, e, gap), gap)
    return spans_of_phases(intervals, int(start.min()), int(end.max()), job_start, job_end)


def spans_of_phases(intervals: Mapping[str, tuple[list[tuple[int, int]], int]], first: int, last: int,
                    job_start: int | None, job_end: int | None) -> list[Span]:
    """The spans of `phase_spans` from each mode's merged stretches (and the gap they were merged with: parts
    merged apart are merged again) and the first step's start and last step's end."""
    spans: list[Span] = []
    if job_start is not None and first > job_start:
        spans.append(Span(int(job_start), first, "Initialization",
                          f"Initialization: {format_duration((first - job_start) / 1e6)} before the first step"))
    for mode in (TRAIN, EVAL, GLOBAL):
        if mode not in intervals:
            continue
        parts, gap = intervals[mode]
        a_s = np.array([a for a, _ in parts], np.int64)
        b_s = np.array([b for _, b in parts], np.int64)
        label = PHASE_LABELS[mode]
        for a, b in merge_intervals(a_s, b_s, gap):
            spans.append(Span(a, b, label, f"{label} ({mode} steps): {format_duration((b - a) / 1e6)}"))
    if job_end is not None and job_end > last:
        spans.append(Span(last, int(job_end), "Finalization",
                          f"Finalization: {format_duration((job_end - last) / 1e6)} after the last step"))
    return spans


# -- flagged moments -------------------------------------------------------------------------------------


def bottleneck_spans(rules: Rules, sample_interval_ms: Mapping[str, float]) -> list[Span]:
    """CPUBottleneck / IOBottleneck ranges (the rules list up to 100 each), one snapshot wide at least: each
    range ends one sampling interval of its node after its last bottleneck snapshot."""
    out = []
    for name, label in (("CPUBottleneck", "CPU bottleneck"), ("IOBottleneck", "I/O bottleneck")):
        for r in BottleneckDetails.from_json(_details(rules, name)).bottlenecks.ranges:
            a, b = r.start_us, r.end_us + int(1000 * sample_interval_ms.get(r.node, 0.0))
            out.append(Span(a, b, label, f"{label} on {r.node}: {r.snapshots} snapshot(s) from {format_us(a)}"))
    return out


def outlier_markers(rules: Rules, limit: int = MAX_MARKERS) -> list[Marker]:
    """StepOutlier's listed outlier steps, one marker per (phase, step number) however many ranks it was slow
    on, the slowest `limit` of them."""
    found: dict[tuple[str, int], list[Any]] = {}
    for entry in StepOutlierDetails.from_json(_details(rules, "StepOutlier")).series.values():
        for sec, n, at in entry.listed():
            key = (entry.phase, int(n))
            prev = found.get(key)
            where = entry.rank_key
            if prev is None:
                found[key] = [int(at), float(sec), [where]]
            else:
                prev[0], prev[1] = min(prev[0], int(at)), max(prev[1], float(sec))
                prev[2].append(where)
    slowest = sorted(found.items(), key=lambda kv: -kv[1][1])[:limit]
    out = []
    for (phase, n), (at, sec, where) in sorted(slowest, key=lambda kv: kv[1][0]):
        ranks = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4 else "")
        out.append(Marker(at, "Outlier step", f"{phase} step {n}: {sec:.3g} s on {ranks}"))
    return out


WINDOW_RULES = (("LowGPUUtilization", "Low GPU utilization"), ("GPUMemoryIncrease", "GPU memory increase"),
                ("BatchSize", "Small batch"))
WINDOW_DETAILS: dict[str, Any] = {"LowGPUUtilization": LowGPUUtilizationDetails,
                                  "GPUMemoryIncrease": GPUMemoryIncreaseDetails, "BatchSize": BatchSizeDetails}


def window_spans(rules: Rules) -> list[Span]:
    """The windows LowGPUUtilization, GPUMemoryIncrease and BatchSize flagged (each lists its first 100 per
    node, with the GPUs concerned)."""
    out = []
    for name, label in WINDOW_RULES:
        for w in WINDOW_DETAILS[name].from_json(_details(rules, name)).flagged.windows:
            devices = ", ".join(w.devices)
            out.append(Span(w.start_us, w.end_us, label,
                            f"{label} on {w.node}{' ' + devices if devices else ''} from {format_us(w.start_us)}"))
    return out


def last_window_markers(rules: Rules) -> list[Marker]:
    """For results stored before the window rules listed their windows: the end of each GPU's (or node's)
    last flagged window, one marker each."""
    out = []
    for name, label in (("LowGPUUtilization", "Low GPU utilization (last)"),
                        ("GPUMemoryIncrease", "GPU memory increase (last)"), ("BatchSize", "Small batch (last)")):
        details = WINDOW_DETAILS[name].from_json(_details(rules, name))
        if details.flagged_windows is not None:
            continue  # drawn as windows
        for node, gpu, at in details.last_flagged():
            where = f"{node} {gpu}" if gpu is not None else node
            out.append(Marker(at, label, f"{name} on {where}: last flagged window"))
    return out


def flag_totals(rules: Rules) -> dict[str, int]:
    """How many of each flag the rules counted (they list only the first or slowest ones)."""
    out = {}
    for name, label in (("CPUBottleneck", "CPU bottleneck"), ("IOBottleneck", "I/O bottleneck")):
        b = BottleneckDetails.from_json(_details(rules, name)).bottlenecks
        if b.ranges_total is not None:
            out[label] = b.ranges_total
    for name, label in WINDOW_RULES:
        flagged = WINDOW_DETAILS[name].from_json(_details(rules, name)).flagged_windows
        if flagged is not None:
            out[label] = flagged.total
    outliers = StepOutlierDetails.from_json(_details(rules, "StepOutlier"))
    if outliers.series:
        out["Outlier step"] = outliers.outliers()
    return out




def _details(rules: Rules, name: str) -> dict[str, Any]:
    result = rules.get(name)
    return result.details if result is not None else {}
