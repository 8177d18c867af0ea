"""Cost of profiling: what stallwatch itself cost this job. Measured in this run: the sampler's bookkeeping
(snapshots written, dropped, ticks missed), the storage the run takes, the sampler's own CPU time and memory
when its node record has them, and the step-time slowdown inside detailed-profiling windows. The always-on
layer's per-step cost is not measurable from inside a run: its benchmark figure is shown as such, and combined
with this run's steps only into a figure called an estimate."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.cost import BENCH_SNAPSHOT_CPU_US, BENCH_SNAPSHOT_TEXT, BENCH_STEP_TEXT, BENCH_STEP_US
from stallwatch.present.report.model import GOOD, INFO, WARN, Paragraph, Section, Table, Verdict
from stallwatch.units import format_value

INTRO = ("What watching this job cost. Numbers marked measured come from this run; numbers marked benchmark come "
         "from stallwatch's own benchmarks (docs/benchmarks.md) on a 2-core development machine, and an estimate "
         "combines a benchmark figure with this run's step count or step time. The system sampler runs in its own "
         "process, outside the training processes, so it never holds their GIL.")


def build(analysis: RunAnalysis) -> list[Section]:
    section = Section("overhead", "Cost of profiling", [Paragraph(INTRO)])
    c = analysis.profiling_cost
    if c.sampler:
        section.blocks.append(Table(["Node", "Interval (ms)", "Snapshots expected", "Snapshots written", "Dropped",
                                     "Ticks missed", "Ticks missed (%)"],
                                    [[r.node, r.sample_interval_ms, r.expected, r.written, r.dropped, r.missed,
                                      r.missed_pct] for r in c.sampler],
                                    "System sampler, measured: did it keep up?"))
    if c.usage:
        section.blocks.append(Table(["Node", "Sampler CPU (s)", "Share of one core (%)", "CPU per snapshot (µs)",
                                     "Sampler peak memory (MB)"],
                                    [[u.node, u.cpu_s, u.core_pct, u.cpu_per_snapshot_us, u.peak_rss_mb]
                                     for u in c.usage], "System sampler's own usage, measured"))
    if not c.usage and c.snapshots:
        cpu_s = c.snapshots * BENCH_SNAPSHOT_CPU_US / 1e6
        section.blocks.append(Paragraph(
            f"This run does not record the sampler's own CPU time or memory. Benchmark: {BENCH_SNAPSHOT_TEXT}. "
            f"Estimate for this run: {c.snapshots:,} snapshots × 556 µs ≈ {format_value(cpu_s, 's')} of CPU time "
            "in all, spread over the job's duration on each node."))
    if c.storage:
        section.blocks.append(Table(["Data", "Size (MB)", "MB per node-hour"],
                                    [[s.kind, s.mb, s.mb_per_node_hour] for s in c.storage], "Storage, measured"))
    share = c.estimated_step_share_pct
    if c.steps:
        total_s = c.steps * BENCH_STEP_US / 1e6
        section.blocks.append(Paragraph(
            f"Always-on PyTorch layer. Benchmark: {BENCH_STEP_TEXT}. Measured in this run: {c.steps:,} steps, median "
            f"step {c.median_step_ms:.3g} ms. Estimate for this run: about {BENCH_STEP_US} µs × {c.steps:,} steps ≈ "
            f"{format_value(total_s, 's')} over all ranks"
            + (f", about {share:.2g} % of the median step." if share is not None else ".")))
    else:
        section.blocks.append(Paragraph("No training steps were recorded, so the always-on PyTorch layer did not run "
                                        "(or the job does not use it): it cost nothing here."))
    if c.windows:
        section.blocks.append(Table(["Rank", "Window", "Steps inside", "Median step inside (ms)",
                                     "Median step outside (ms)", "Change (%)", "Step after the window (ms)"],
                                    [[w.rank, w.window, w.steps_inside, w.median_inside_ms, w.median_outside_ms,
                                      w.change_pct, w.step_after_ms] for w in c.windows],
                                    "Detailed-profiling windows, measured: steps inside a window against the "
                                    "same rank's other steps; the step after a window includes stopping the "
                                    "profiler and exporting its trace"))
    if c.warnings:
        section.blocks.append(Verdict("Profiling did not run cleanly: " + "; ".join(c.warnings) + ".", WARN))
    elif share is not None and share >= 1.0:
        section.blocks.append(Verdict(
            f"With steps this short (median {c.median_step_ms:.3g} ms) the always-on layer's fixed per-step cost is an "
            f"estimated {share:.2g} % of each step: lengthen the steps (larger batches) or accept the cost.", INFO))
    else:
        section.blocks.append(Verdict("Profiling ran cleanly: the sampler kept up and dropped nothing"
                                      + (f", and the always-on layer's estimated cost is {share:.2g} % of the median "
                                         "step." if share is not None else "."), GOOD))
    return [section]
