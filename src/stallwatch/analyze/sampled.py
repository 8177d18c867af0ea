"""Steps counted but not timed: where a rank ran faster than `sample_steps_above_per_s`, its job timed steps in
short stretches and counted the others (torch/sampling.py), recorded as `untimed` markers. The counts belong in
every step total; per-step figures (step times, phase shares, outliers) come from the timed steps, a sample of
TIMED_S of every second, and the times at stake that rules add up over steps are scaled up to the whole loop."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from stallwatch.analyze.steps import LoopSpan, StepStat, mode_order


@dataclass(frozen=True)
class Untimed:
    """One rank's steps of one mode that were counted, not timed, and the span of the stretches they ran in."""

    node: str
    rank: int
    mode: str
    steps: int
    stretches: int
    untimed_us: int  # the time those steps took, together
    first_us: int
    last_us: int


def untimed(table: pa.Table) -> list[Untimed]:
    """Per node, rank and mode, the `untimed` markers (`Run.framework(kinds=[UNTIMED])`) summed; a marker whose
    args do not read as counts is skipped (a run directory is untrusted)."""
    acc: dict[tuple[str, int, str], list[int]] = {}
    for row in table.select(["node", "rank", "mode", "start_us", "end_us", "args"]).to_pylist():
        try:
            args = json.loads(row["args"] or "{}")
            steps, stretches, us = int(args.get("steps", 0)), int(args.get("stretches", 0)), int(args.get("us", 0))
        except (ValueError, TypeError, AttributeError, OverflowError):
            continue
        if steps <= 0 or not isinstance(row["start_us"], int) or not isinstance(row["end_us"], int):
            continue
        a = acc.setdefault((row["node"], row["rank"], str(row["mode"])), [0, 0, 0, row["start_us"], row["end_us"]])
        a[0] += steps
        a[1] += max(stretches, 0)
        a[2] += min(max(us, 0), max(row["end_us"] - row["start_us"], 0))
        a[3], a[4] = min(a[3], row["start_us"]), max(a[4], row["end_us"])
    return [Untimed(node, rank, mode, *values) for (node, rank, mode), values in sorted(acc.items())]


def steps_at(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Each `untimed` marker's end and how many steps it counted (0 where its args do not say)."""
    ends, counts = [], []
    for row in table.select(["end_us", "args"]).to_pylist():
        try:
            n = int(json.loads(row["args"] or "{}").get("steps", 0))
        except (ValueError, TypeError, AttributeError, OverflowError):
            continue
        if n > 0 and isinstance(row["end_us"], int):
            ends.append(row["end_us"])
            counts.append(n)
    return np.asarray(ends, np.int64), np.asarray(counts, np.int64)


def progress(ends: np.ndarray, counts: np.ndarray, points: int) -> dict[str, list[int]]:
    """Steps done over time from (time, steps done then) pairs in any order, at most `points` points."""
    if not len(ends):
        return {"t": [], "steps": []}
    order = np.argsort(ends, kind="stable")
    t, done = ends[order], np.cumsum(counts[order])
    idx = np.unique(np.linspace(0, len(t) - 1, min(points, len(t))).astype(np.int64))
    return {"t": t[idx].tolist(), "steps": done[idx].tolist()}


def with_untimed(stats: list[StepStat], parts: list[Untimed]) -> list[StepStat]:
    """Step statistics with each rank and mode's untimed count beside its timed steps."""
    if not parts:
        return stats
    counted = {(u.node, u.rank, u.mode): u.steps for u in parts}
    return [replace(s, untimed=counted.get((s.node, s.rank, s.mode), 0)) for s in stats]


def per_mode(parts: list[Untimed]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for u in parts:
        counts[u.mode] = counts.get(u.mode, 0) + u.steps
    return counts


def add_counts(timed: dict[str, int], parts: list[Untimed]) -> dict[str, int]:
    """Step counts per mode with the untimed ones added, in the modes' order."""
    out = dict(timed)
    for mode, n in per_mode(parts).items():
        out[mode] = out.get(mode, 0) + n
    return dict(sorted(out.items(), key=lambda kv: (mode_order(kv[0]), kv[0])))


def extend_loop(loop: LoopSpan | None, parts: list[Untimed]) -> LoopSpan | None:
    """The training loop's span and step count with the untimed steps in it (they may begin and end it)."""
    if not parts:
        return loop
    first, last = min(u.first_us for u in parts), max(u.last_us for u in parts)
    steps = sum(u.steps for u in parts)
    if loop is None:
        return LoopSpan(first, last, steps)
    return LoopSpan(min(loop.first_us, first), max(loop.last_us, last), loop.steps + steps)


def timed_share(parts: list[Untimed], ranks: int, loop_us: int) -> float:
    """The share of the ranks' loop time in which steps were timed (1.0 when none were sampled): what a sum over
    timed steps is of the same sum over all of them, where the timed stretches are a fair sample."""
    untimed_us = sum(u.untimed_us for u in parts)
    whole = ranks * loop_us
    if not untimed_us or whole <= 0:
        return 1.0
    return min(max(1 - untimed_us / whole, 1e-3), 1.0)


def notes(parts: list[Untimed], timed: dict[str, int]) -> list[str]:
    """One line per run where steps were sampled: how many were counted without being timed."""
    if not parts:
        return []
    untimed_steps = sum(u.steps for u in parts)
    total = sum(timed.values()) + untimed_steps
    ranks = sorted({f"{u.node}/{u.rank}" for u in parts})
    where = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks ({', '.join(ranks[:4])}" + \
        (", …)" if len(ranks) > 4 else ")")
    return [f"steps were sampled on {where}: {untimed_steps:,} of {total:,} steps "
            f"({100 * untimed_steps / max(total, 1):.0f} %) were counted, not timed — at more steps a second than "
            "sample_steps_above_per_s, the job times steps in short stretches every second so that stallwatch "
            "costs it little. Step times, phase shares and outliers come from the timed steps; totals include all"]
