"""What watching the job cost, from the run itself: the sampler's bookkeeping (snapshots expected, written,
dropped, ticks missed), its own CPU time and memory, the storage the run takes, and the step-time change
inside detailed-profiling windows. Benchmark figures (the always-on layer's per-step cost) are constants here,
labelled as benchmarks wherever they are shown, and combined with this run's steps only into estimates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.steps import node_rank_mode
from stallwatch.store.node_record import NodeRecord

# Benchmark figures (docs/benchmarks.md, measured on the 2-core development machine), never this run's.
BENCH_STEP_US = 15.4  # always-on PyTorch layer, median extra µs per step, micro step of ~0.2 ms
BENCH_STEP_TEXT = "+15.4 µs per step (median) on a ~0.2 ms micro step; +35.8 µs (+0.85 %) on a ~5 ms step"
BENCH_SNAPSHOT_CPU_US = 556.0  # sampler process CPU per snapshot at 500 ms, writing included
BENCH_SNAPSHOT_TEXT = "556 µs of CPU per snapshot at 500 ms (0.111 % of one core), writing included"
MB = 1e6
STORAGE_KINDS = {"system": "System metrics", "framework": "Framework events", "traces": "Profiling windows"}
OTHER_FILES = "Run metadata, rules, report"


@dataclass(frozen=True)
class SamplerKeepUp:
    """Did a node's sampler keep up? Measured from its node record."""
    node: str
    sample_interval_ms: float | None
    expected: int | None
    written: int | None
    dropped: int | None
    missed: int | None
    missed_pct: float | None


@dataclass(frozen=True)
class SamplerUsage:
    """The sampler's own CPU time and peak memory, where its node record has them."""
    node: str
    cpu_s: float | None
    core_pct: float | None
    cpu_per_snapshot_us: float | None
    peak_rss_mb: float | None


@dataclass(frozen=True)
class StorageUse:
    kind: str
    mb: float
    mb_per_node_hour: float | None


@dataclass(frozen=True)
class WindowCost:
    """A detailed-profiling window's steps against the same rank's steps of that mode outside every window."""
    rank: str  # "node/rank"
    window: str
    steps_inside: int
    median_inside_ms: float | None
    median_outside_ms: float | None
    change_pct: float | None
    step_after_ms: float | None  # the first step after it: the profiler stops and exports there


@dataclass(frozen=True)
class ProfilingCost:
    sampler: list[SamplerKeepUp]
    warnings: list[str]
    usage: list[SamplerUsage]
    storage: list[StorageUse]
    snapshots: int
    steps: int
    median_step_ms: float | None
    windows: list[WindowCost] = field(default_factory=list)

    @property
    def estimated_step_share_pct(self) -> float | None:
        """The always-on layer's benchmark cost as a share of this run's median step: an estimate."""
        return 100.0 * BENCH_STEP_US / 1000.0 / self.median_step_ms if self.median_step_ms else None


def profiling_cost(records: Mapping[str, NodeRecord], files: Iterable[Any], *, steps: int,
                   median_step_ms: float | None, windows: Sequence[WindowCost]) -> ProfilingCost:
    """`records`: node name -> its record; `files`: the run's files (path, size); `steps`: the run's step
    events, `median_step_ms` their typical duration; `windows`: the detailed-profiling windows' `window_costs`."""
    sampler, warnings = keep_up(records)
    return ProfilingCost(sampler, warnings, sampler_usage(records), storage(records, files),
                         sum(r.samples_written or 0 for r in records.values()), steps,
                         median_step_ms, list(windows))


def keep_up(records: Mapping[str, NodeRecord]) -> tuple[list[SamplerKeepUp], list[str]]:
    rows, warnings = [], []
    for node, rec in records.items():
        interval = float(rec.sample_interval_ms) if rec.sample_interval_ms is not None else None
        start, end = rec.start_us, rec.sampler_end_us or rec.end_us
        expected = _expected(start, end, interval, rec.interval_changes)
        written, dropped, missed = rec.samples_written, rec.samples_dropped, rec.ticks_missed
        missed_pct = 100.0 * missed / expected if missed is not None and expected else None
        rows.append(SamplerKeepUp(node, interval, expected, written, dropped, missed,
                                  None if missed_pct is None else round(missed_pct, 2)))
        if dropped:
            warnings.append(f"the sampler on {node} dropped {dropped} snapshots (storage full or failing)")
        if missed_pct is not None and missed_pct >= 1.0:
            warnings.append(f"the sampler on {node} missed {missed} ticks ({missed_pct:.1f} % of the snapshots it "
                            "should have taken): the machine was too busy to wake it on time")
    return rows, warnings


def _expected(start: int | None, end: int | None, interval: float | None,
              changes: list[tuple[int, float]]) -> int | None:
    """Snapshots the sampler should have taken from `start` to `end`: each stretch at its own interval."""
    if not (interval and start and end and end > start):
        return None
    if not changes:
        return int((end - start) / (interval * 1000)) + 1
    bounds = [start] + [min(max(t, start), end) for t, _ in changes[1:]] + [end]
    return sum(int((b - a) / (ms * 1000)) for (a, b), (_, ms) in zip(zip(bounds, bounds[1:]), changes)) + 1


def sampler_usage(records: Mapping[str, NodeRecord]) -> list[SamplerUsage]:
    out = []
    for node, rec in records.items():
        cpu_s = rec.sampler_cpu_s
        rss = float(rec.sampler_max_rss_bytes) if rec.sampler_max_rss_bytes is not None else None
        if cpu_s is None and rss is None:
            continue
        start, end = rec.start_us, rec.sampler_end_us or rec.end_us
        ran = cpu_s is not None and start and end and end > start
        core_pct = round(100.0 * cpu_s / ((end - start) / 1e6), 3) if ran else None
        written = rec.samples_written
        per_snapshot = round(1e6 * cpu_s / written) if cpu_s is not None and written else None
        out.append(SamplerUsage(node, cpu_s, core_pct, per_snapshot, None if rss is None else round(rss / MB, 1)))
    return out


def storage(records: Mapping[str, NodeRecord], files: Iterable[Any]) -> list[StorageUse]:
    """Bytes on storage by kind of data, and per node-hour of system data."""
    sizes: dict[str, int] = {}
    for entry in files:
        kind = STORAGE_KINDS.get(entry.path.split("/", 1)[0], OTHER_FILES)
        sizes[kind] = sizes.get(kind, 0) + int(entry.size)
    hours = 0.0
    for rec in records.values():
        start, end = rec.start_us, rec.end_us or rec.end_us_from_data
        if start and end and end > start:
            hours += (end - start) / 3.6e9
    out = []
    for kind in (*STORAGE_KINDS.values(), OTHER_FILES):
        if kind in sizes:
            per_hour = float(f"{sizes[kind] / MB / hours:.3g}") if kind == "System metrics" and hours > 0 else None
            out.append(StorageUse(kind, round(sizes[kind] / MB, 3), per_hour))
    return out


def window_costs(steps: FrameworkColumns, windows: Sequence[Mapping[str, Any]],
                 others: Sequence[Mapping[str, Any]] | None = None) -> list[WindowCost]:
    """Each window's steps against its rank's steps of that mode outside every window of `others` (default:
    `windows`)."""
    windows = [w for w in windows if _int(w.get("start_us")) and _int(w.get("end_us"))]
    others = windows if others is None else [w for w in others if _int(w.get("start_us")) and _int(w.get("end_us"))]
    out = []
    for w in windows:
        node, rank, mode = str(w.get("node")), _int(w.get("rank")), str(w.get("mode") or "TRAIN")
        if rank is None:
            continue
        mine = node_rank_mode(steps, node, rank, mode)
        start, end = steps.start[mine], steps.end[mine]
        if len(start) == 0:
            continue
        inside = (start >= w["start_us"]) & (end <= w["end_us"])
        in_any = np.zeros(len(start), bool)
        for other in others:
            if str(other.get("node")) == node and _int(other.get("rank")) == rank:
                in_any |= (end > other["start_us"]) & (start < other["end_us"])
        after = np.flatnonzero(start >= w["end_us"])
        dur = (end - start) / 1000.0
        med_in = float(np.median(dur[inside])) if inside.any() else None
        med_out = float(np.median(dur[~in_any])) if (~in_any).any() else None
        change = 100.0 * (med_in - med_out) / med_out if med_in is not None and med_out else None
        out.append(WindowCost(f"{node}/{rank}", str(w.get("window") or str(w.get("path", "")).rsplit("/", 1)[-1]),
                              int(inside.sum()), _r(med_in), _r(med_out), _r(change),
                              _r(float(dur[after[0]])) if len(after) else None))
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

