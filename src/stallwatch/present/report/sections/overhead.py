"""Cost of profiling: what stallwatch itself cost this job. Measured in this run: the sampler's bookkeeping
(snapshots written, dropped, ticks missed), the storage the run takes, the sampler's own CPU time and memory
when its node record has them, and the step-time slowdown inside detailed-profiling windows. The always-on
layer's per-step cost is not measurable from inside a run: its benchmark figure is shown as such, and combined
with this run's steps only into a figure called an estimate."""

from __future__ import annotations

from typing import Any

import numpy as np

from stallwatch.present.report.model import GOOD, INFO, WARN, Paragraph, Section, Table, Verdict
from stallwatch.present.report.sections.timeline import StepColumns, cached_steps
from stallwatch.store import layout
from stallwatch.timeutil import format_duration

# Benchmark figures (docs/benchmarks.md, measured on the 2-core development machine), never this run's.
BENCH_STEP_US = 15.4  # always-on PyTorch layer, median extra µs per step, micro step of ~0.2 ms
BENCH_STEP_TEXT = "+15.4 µs per step (median) on a ~0.2 ms micro step; +35.8 µs (+0.85 %) on a ~5 ms step"
BENCH_SNAPSHOT_CPU_US = 556.0  # sampler process CPU per snapshot at 500 ms, writing included
BENCH_SNAPSHOT_TEXT = "556 µs of CPU per snapshot at 500 ms (0.111 % of one core), writing included"
MB = 1e6

INTRO = ("What watching this job cost. Numbers marked measured come from this run; numbers marked benchmark come "
         "from stallwatch's own benchmarks (docs/benchmarks.md) on a 2-core development machine, and an estimate "
         "combines a benchmark figure with this run's step count or step time. The system sampler runs in its own "
         "process, outside the training processes, so it never holds their GIL.")


def sampler_rows(ctx: Any) -> tuple[list[list[Any]], list[str]]:
    """Per node: interval, expected and written snapshots, dropped, ticks missed (measured); and warnings."""
    rows, warnings = [], []
    for node in ctx.nodes:
        rec = ctx.node_info(node)
        interval_ms = rec.get("sample_interval_ms")
        start, end = rec.get("start_us"), rec.get("sampler_end_us") or rec.get("end_us")
        expected = int((end - start) / (interval_ms * 1000)) + 1 if interval_ms and start and end else None
        written, dropped, missed = rec.get("samples_written"), rec.get("samples_dropped"), rec.get("ticks_missed")
        missed_pct = 100.0 * missed / expected if missed is not None and expected else None
        rows.append([node, interval_ms, expected, written, dropped, missed,
                     None if missed_pct is None else round(missed_pct, 2)])
        if dropped:
            warnings.append(f"the sampler on {node} dropped {dropped} snapshots (storage full or failing)")
        if missed_pct is not None and missed_pct >= 1.0:
            warnings.append(f"the sampler on {node} missed {missed} ticks ({missed_pct:.1f} % of the snapshots it "
                            "should have taken): the machine was too busy to wake it on time")
    return rows, warnings


def sampler_usage_rows(ctx: Any) -> list[list[Any]]:
    """The sampler's own CPU time and peak memory where its node record has them (`sampler_cpu_s`,
    `sampler_max_rss_bytes`), with the share of one core over the time it ran."""
    rows = []
    for node in ctx.nodes:
        rec = ctx.node_info(node)
        cpu_s, rss = rec.get("sampler_cpu_s"), rec.get("sampler_max_rss_bytes")
        if cpu_s is None and rss is None:
            continue
        start, end = rec.get("start_us"), rec.get("sampler_end_us") or rec.get("end_us")
        ran = cpu_s is not None and start and end and end > start
        core_pct = round(100.0 * cpu_s / ((end - start) / 1e6), 3) if ran else None
        written = rec.get("samples_written")
        per_snapshot = round(1e6 * cpu_s / written) if cpu_s is not None and written else None
        rows.append([node, cpu_s, core_pct, per_snapshot, None if rss is None else round(rss / MB, 1)])
    return rows


def storage_rows(ctx: Any) -> list[list[Any]]:
    """Bytes on storage by kind of data (measured), and per node-hour of system data."""
    sizes: dict[str, int] = {}
    for entry in ctx.run.files():
        top = entry.path.split("/", 1)[0]
        kind = {layout.SYSTEM_DIR: "System metrics", layout.FRAMEWORK_DIR: "Framework events",
                layout.TRACES_DIR: "Profiling windows"}.get(top, "Run metadata, rules, report")
        sizes[kind] = sizes.get(kind, 0) + int(entry.size)
    hours = 0.0
    for node in ctx.nodes:
        rec = ctx.node_info(node)
        start, end = rec.get("start_us"), rec.get("end_us") or rec.get("end_us_from_data")
        if start and end and end > start:
            hours += (end - start) / 3.6e9
    rows = []
    for kind in ("System metrics", "Framework events", "Profiling windows", "Run metadata, rules, report"):
        if kind in sizes:
            per_hour = float(f"{sizes[kind] / MB / hours:.3g}") if kind == "System metrics" and hours > 0 else None
            rows.append([kind, round(sizes[kind] / MB, 3), per_hour])
    return rows


def step_durations(steps: StepColumns) -> tuple[int, float | None]:
    """Steps recorded (measured) and their median duration in ms."""
    n = len(steps.start)
    if n == 0:
        return 0, None
    return n, float(np.median(steps.end - steps.start)) / 1000.0


def window_rows(ctx: Any) -> list[list[Any]]:
    """Per detailed-profiling window: the median step inside it against the same rank's steps of that mode
    outside every window, and the first step after it (where the profiler stops and exports), measured."""
    windows = [w for w in ctx.run.profiles("detailed") if w.get("start_us") and w.get("end_us")]
    if not windows:
        return []
    steps = cached_steps(ctx)
    rows = []
    for w in windows:
        node, rank, mode = str(w.get("node")), int(w.get("rank", -1)), str(w.get("mode") or "TRAIN")
        mine = steps.node_is(node) & (steps.rank == rank) & steps.mode_is(mode)
        start, end = steps.start[mine], steps.end[mine]
        if len(start) == 0:
            continue
        inside = (start >= w["start_us"]) & (end <= w["end_us"])
        in_any = np.zeros(len(start), bool)
        for other in windows:
            if str(other.get("node")) == node and int(other.get("rank", -1)) == rank:
                in_any |= (end > other["start_us"]) & (start < other["end_us"])
        outside = ~in_any
        after = np.flatnonzero(start >= w["end_us"])
        dur = (end - start) / 1000.0
        med_in = float(np.median(dur[inside])) if inside.any() else None
        med_out = float(np.median(dur[outside])) if outside.any() else None
        change = 100.0 * (med_in - med_out) / med_out if med_in is not None and med_out else None
        rows.append([f"{node}/{rank}", w.get("window") or w.get("path", "").rsplit("/", 1)[-1],
                     int(inside.sum()), _r(med_in), _r(med_out), _r(change),
                     _r(float(dur[after[0]])) if len(after) else None])
    return rows


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def build(ctx: Any) -> list[Section]:
    section = Section("overhead", "Cost of profiling", [Paragraph(INTRO)])
    rows, warnings = sampler_rows(ctx)
    if rows:
        section.blocks.append(Table(["Node", "Interval (ms)", "Snapshots expected", "Snapshots written", "Dropped",
                                     "Ticks missed", "Ticks missed (%)"], rows,
                                    "System sampler, measured: did it keep up?"))
    usage = sampler_usage_rows(ctx)
    if usage:
        section.blocks.append(Table(["Node", "Sampler CPU (s)", "Share of one core (%)", "CPU per snapshot (µs)",
                                     "Sampler peak memory (MB)"], usage, "System sampler's own usage, measured"))
    snapshots = sum(int(ctx.node_info(n).get("samples_written") or 0) for n in ctx.nodes)
    if not usage and snapshots:
        cpu_s = snapshots * BENCH_SNAPSHOT_CPU_US / 1e6
        section.blocks.append(Paragraph(
            f"This run does not record the sampler's own CPU time or memory. Benchmark: {BENCH_SNAPSHOT_TEXT}. "
            f"Estimate for this run: {snapshots:,} snapshots × 556 µs ≈ {format_duration(cpu_s)} of CPU time "
            "in all, spread over the job's duration on each node."))
    storage = storage_rows(ctx)
    if storage:
        section.blocks.append(Table(["Data", "Size (MB)", "MB per node-hour"], storage, "Storage, measured"))
    steps, median_ms = step_durations(cached_steps(ctx))
    if steps:
        total_s = steps * BENCH_STEP_US / 1e6
        share = 100.0 * BENCH_STEP_US / 1000.0 / median_ms if median_ms else None
        section.blocks.append(Paragraph(
            f"Always-on PyTorch layer. Benchmark: {BENCH_STEP_TEXT}. Measured in this run: {steps:,} steps, median "
            f"step {median_ms:.3g} ms. Estimate for this run: about {BENCH_STEP_US} µs × {steps:,} steps ≈ "
            f"{format_duration(total_s)} over all ranks"
            + (f", about {share:.2g} % of the median step." if share is not None else ".")))
    else:
        share = None
        section.blocks.append(Paragraph("No training steps were recorded, so the always-on PyTorch layer did not run "
                                        "(or the job does not use it): it cost nothing here."))
    windows = window_rows(ctx)
    if windows:
        section.blocks.append(Table(["Rank", "Window", "Steps inside", "Median step inside (ms)",
                                     "Median step outside (ms)", "Change (%)", "Step after the window (ms)"], windows,
                                    "Detailed-profiling windows, measured: steps inside a window against the "
                                    "same rank's other steps; the step after a window includes stopping the "
                                    "profiler and exporting its trace"))
    if warnings:
        section.blocks.append(Verdict("Profiling did not run cleanly: " + "; ".join(warnings) + ".", WARN))
    elif share is not None and share >= 1.0:
        section.blocks.append(Verdict(
            f"With steps this short (median {median_ms:.3g} ms) the always-on layer's fixed per-step cost is an "
            f"estimated {share:.2g} % of each step: lengthen the steps (larger batches) or accept the cost.", INFO))
    else:
        section.blocks.append(Verdict("Profiling ran cleanly: the sampler kept up and dropped nothing"
                                      + (f", and the always-on layer's estimated cost is {share:.2g} % of the median "
                                         "step." if share is not None else "."), GOOD))
    return [section]
