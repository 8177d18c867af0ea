"""Plain-text tables for the terminal."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

from stallwatch.analyze.catalog import RunRow
from stallwatch.analyze.findings import Finding, Findings, share_text
from stallwatch.analyze.job_usage import JobUsage
from stallwatch.analyze.steps import PHASES, StepStat
from stallwatch.analyze.usage import NodeSpan, UsageStat
from stallwatch.records import FORWARD
from stallwatch.timeutil import format_duration, format_us
from stallwatch.units import format_value


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """Columns padded to their widest cell; `align` has one 'l' or 'r' per column."""
    align = align or "l" * len(headers)
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if a == "r" else str(c).ljust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def human(value: float, unit: str) -> str:
    """A value for the terminal: bytes and rates on the units' ladder, as the report and the dashboard show them
    (1.2 kB/s, 5 GB; `stallwatch.units`), percentages with one decimal and no space (columns stay narrow), NaN
    a dash."""
    if value != value:  # NaN
        return "-"
    if unit in ("B", "B/s"):
        return format_value(value, unit)
    if unit == "%":
        return f"{value:.1f}%"
    return f"{value:.1f}"


def usage_table(stats: Sequence[UsageStat]) -> str:
    rows = [[s.node, s.label, human(s.mean, s.unit), human(s.p50, s.unit), human(s.p95, s.unit), human(s.max, s.unit)]
            for s in stats]
    return table(["node", "metric", "mean", "p50", "p95", "max"], rows, "llrrrr")


def job_line(job: JobUsage) -> str:
    """Whose CPU it was, in a line: the job's own processes beside the host's CPUs, its RSS, its workers."""
    def cores(v: float | None) -> str:
        return "" if v is None else f" ({v:.1f} cores)"

    cpu = job.job_cpu
    of = f"the host's {job.cores} cores" if job.cores else "the host's cores"
    text = (f"{job.node}: the job's own processes used {cpu.mean_pct:.0f}% of {of} on average"
            f"{cores(cpu.mean_cores)}, p95 {cpu.p95_pct:.0f}%{cores(cpu.p95_cores)}")
    if job.host_cpu is not None:
        text += f"; the host's CPUs (every process) {job.host_cpu.mean_pct:.0f}%"
        if job.mostly_others:
            text += ": busy mostly with other work, not the job"
    parts = [text]
    if job.rss_max_bytes is not None:
        parts.append(f"RSS up to {format_value(job.rss_max_bytes, 'B')}")
    if job.workers_max:
        busy = job.workers_cpu
        parts.append(f"{job.workers_max} loader worker(s)" + ("" if busy is None else
                                                              f" using {busy.mean_pct:.0f}%{cores(busy.mean_cores)}"))
    elif job.workers_max == 0:
        parts.append("no loader workers")
    return textwrap.fill("; ".join(parts), 110, initial_indent="  ", subsequent_indent="    ",
                         break_on_hyphens=False)


GPU_PHASES_NOTE = ("On a GPU these phases are host time: a call returns once its kernels are queued, and the GPU's "
                   "work shows where the loop waits for it (\"other\" after a `loss.item()`, or the call that found "
                   "the queue full); the steps' durations are right either way. The GPU's own split: "
                   "--detailed-profiling.")


def steps_table(stats: Sequence[StepStat], *, gpu: bool = False) -> str:
    """One row per node, rank and mode; phases as shares of the step time, and "other": the rest of the step,
    in none of them (the loop's own code: batches built by hand, logging, the loss; collectives). On a GPU run,
    a note says the phases are host time (measured on an H100: "other" 91 % where CUDA events said forward 34 %)."""
    def ms(v: float) -> str:
        return f"{v:.1f} ms" if v < 1000 else f"{v / 1000:.2f} s"

    def other(s: StepStat) -> str:
        if FORWARD not in s.phase_pct:
            return "-"  # the model's calls are not timed (Keras on JAX: data wait only): the rest is unknown
        return f"{max(0.0, 100.0 - sum(s.phase_pct.get(p, 0.0) for p in PHASES)):.0f}%"

    def steps(s: StepStat) -> str:  # sampled steps: all of them, and how many the figures come from
        return f"{s.steps + s.untimed} ({s.steps} timed)" if s.untimed else str(s.steps)

    rows = [[s.node, str(s.rank), s.mode, steps(s), ms(s.p50_ms), ms(s.p95_ms),
             f"{ms(s.max_ms)} (#{s.slowest_step})",
             *(f"{s.phase_pct[p]:.0f}%" if p in s.phase_pct else "-" for p in PHASES), other(s)] for s in stats]
    text = table(["node", "rank", "mode", "steps", "p50", "p95", "slowest", "data wait", "forward", "backward",
                  "optimizer", "other"], rows, "lllrrrrrrrrr")
    return f"{text}\n{textwrap.fill(GPU_PHASES_NOTE, 110)}" if gpu and rows else text


def _cadence(interval_ms: float | None, changes: Sequence[tuple[int, float]]) -> str:
    """How often a node sampled: its one interval, or each interval it was changed to live and from when (the
    summary must not name only the first when the dashboard or `stallwatch config` changed it)."""
    if changes:
        later = [f"every {ms:g} ms from {format_us(t)[11:]}" for t, ms in changes[1:]]
        return ", " + ", then ".join([f"one every {changes[0][1]:g} ms", *later])
    return f", one every {interval_ms:g} ms" if interval_ms else ""


def run_summary(*, run_uri: str, exit_code: int, start_us: int, end_us: int,
                spans: Sequence[NodeSpan], stats: Sequence[UsageStat], sample_interval_ms: float | None = None,
                steps: Sequence[StepStat] = (), windows: Sequence[dict] = (), exit_signal: str | None = None,
                interrupted: bool = False, notes: Sequence[str] = (), gpu: bool = False,
                jobs: Sequence[JobUsage] = (), interval_changes: Mapping[str, Sequence[tuple[int, float]]] | None = None,
                ) -> str:
    how = ", ".join(filter(None, [exit_signal, "interrupted" if interrupted else None]))
    lines = [
        f"stallwatch: run {run_uri}",
        f"  command exit code {exit_code}{f' ({how})' if how else ''}, duration "
        f"{format_duration((end_us - start_us) / 1e6)} ({format_us(start_us)} → {format_us(end_us)})",
    ]
    lines += [f"  note: {n}" for n in notes]
    for s in spans:
        lines.append(f"  {s.node}: {s.snapshots} system snapshots"
                     f"{_cadence(sample_interval_ms, (interval_changes or {}).get(s.node) or ())}")
    if stats:
        lines += ["", usage_table(stats)]
        lines += [job_line(j) for j in jobs]
    else:
        lines.append("  no system samples were stored")
    if steps:
        lines += ["", steps_table(steps, gpu=gpu)]
    for w in windows:
        first, last = w.get("first_step"), w.get("last_step")
        what = f"steps {first}-{last}" if first is not None else "a time window"
        lines.append(f"  {w.get('layer')} profiling of rank {w.get('rank')}, {what}: {run_uri}/{w.get('path')}")
    return "\n".join(lines)


def findings_text(findings: Findings, width: int = 100) -> str:
    """What to fix first, for the terminal: the verdict, then each finding with its time at stake, where it
    was seen and the change to try."""
    lines = ["What to fix first:", "  " + findings.verdict]
    for i, f in enumerate(findings.findings, 1):
        stake = f" — {format_duration(f.time_at_stake_s)} at stake" if f.time_at_stake_s is not None else ""
        said = share_text(f.share_of_loop, f.share_of)
        share = f" ({said})" if said else ""
        lines.append(f"  {i}. [{f.severity}] {f.title}{stake}{share}")
        where = where_text(f)
        if where:
            lines.append(f"     where: {where}")
        lines.append("     try: " + textwrap.shorten(f.recommendation, width=width * 2, placeholder=" …"))
    for note in findings.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def where_text(f: Finding) -> str:
    """Where a finding was seen, in a few words: ranks (or nodes), the first steps, the time windows."""
    w = f.where
    parts = []
    if w.ranks:
        parts.append("ranks " + ", ".join(w.ranks[:8]) + (" …" if len(w.ranks) > 8 else ""))
    elif w.nodes:
        parts.append("nodes " + ", ".join(w.nodes[:8]) + (" …" if len(w.nodes) > 8 else ""))
    if w.steps:
        parts.append("steps " + ", ".join(str(n) for n in w.steps[:10]) + (" …" if len(w.steps) > 10 else ""))
    if w.windows:
        parts.append(f"{len(w.windows)} time window(s), the first at {format_us(w.windows[0][0])}")
    return "; ".join(parts)


def runs_table(rows: Sequence[RunRow]) -> str:
    """`stallwatch ls`: one line per run, newest first."""
    def status(r: RunRow) -> str:
        if r.status in ("running", "unknown"):
            return r.status
        return f"{r.status} ({r.signal})" if r.signal else f"{r.status} ({r.exit_code})"

    def steps(r: RunRow) -> str:
        return "-" if r.steps is None else (", ".join(f"{n:,} {m}" for m, n in r.steps.items()) or "0")

    lines = [[r.id if r.run_id in ("", r.id) else f"{r.id} (id {r.run_id})", status(r), format_us(r.start_us), format_duration(r.duration_s) if r.duration_s is not None
              else "-", ",".join(r.nodes) or "-", steps(r), textwrap.shorten(r.top_finding or "-", 60)]
             for r in rows]
    return table(["run", "status", "start", "duration", "nodes", "steps", "top finding"], lines, "lllrlrl")
