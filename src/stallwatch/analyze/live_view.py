"""The job summary as it stands now: the stored summary (which trails the job by a flush interval) brought up to
date with the nodes' live counts (`store.live_status`, a second behind): steps per mode, duration, ranks, the
loop so far, progress and phase shares. Pure: the stored figures and the live counts in, the figures to show out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from stallwatch.records import TRAIN
from stallwatch.store.live_status import LiveNode, Notice

PROGRESS_POINTS = 200
RATE_WINDOW_US = 3_000_000  # the step rate is measured over the newest few seconds of progress


@dataclass(frozen=True)
class LiveFigures:
    """Every node's live counts together."""
    written_us: int
    running: bool
    steps: dict[str, int]
    ranks: dict[str, list[str]]
    first_us: int | None
    last_us: int | None
    latest_step: int | None  # the newest TRAIN step number of any rank
    steps_per_s: float | None  # TRAIN step numbers per second of one rank, recently
    progress: dict[str, list[int]]
    phase_shares: dict[str, dict[str, float]]
    notices: tuple[Notice, ...]


@dataclass(frozen=True)
class Overview:
    """What the summary shows, up to date: replaces the stored figures of the same names."""
    steps: dict[str, int]
    total_steps: int
    duration_s: float
    last_us: int | None
    ranks: dict[str, list[str]]
    loop_s: float
    parts_s: dict[str, float] | None
    progress: dict[str, list[Any]]
    phase_shares: dict[str, dict[str, float]]
    latest_step: int | None
    live_us: int | None  # when the live counts used were written (None: stored figures only)


def live_figures(nodes: Mapping[str, LiveNode]) -> LiveFigures | None:
    if not nodes:
        return None
    steps: dict[str, int] = {}
    step_us: dict[str, int] = {}
    phase_us: dict[str, dict[str, int]] = {}
    firsts, lasts, latest, rates = [], [], [], []
    for node in nodes.values():
        for mode, n in node.steps.items():
            steps[mode] = steps.get(mode, 0) + n
        for mode, us in node.step_us.items():
            step_us[mode] = step_us.get(mode, 0) + us
        for mode, phases in node.phase_us.items():
            acc = phase_us.setdefault(mode, {})
            for k, us in phases.items():
                acc[k] = acc.get(k, 0) + us
        for r in node.ranks:
            firsts += [r.first_us] if r.first_us is not None else []
            lasts += [r.last_us] if r.last_us is not None else []
            latest += [r.last_step[TRAIN]] if TRAIN in r.last_step else []
        rate = _recent_rate(node.progress)
        train_ranks = sum(1 for r in node.ranks if r.steps.get(TRAIN))
        if rate is not None and train_ranks:
            rates.append(rate / train_ranks)
    shares = {m: {k: 100.0 * us / step_us[m] for k, us in phases.items()}
              for m, phases in phase_us.items() if step_us.get(m)}
    return LiveFigures(written_us=max(n.written_us for n in nodes.values()),
                       running=any(n.running for n in nodes.values()), steps=steps,
                       ranks={name: [str(r.rank) for r in n.ranks] for name, n in nodes.items()},
                       first_us=min(firsts, default=None), last_us=max(lasts, default=None),
                       latest_step=max(latest, default=None), steps_per_s=max(rates, default=None),
                       progress=_merged_progress([n.progress for n in nodes.values()]), phase_shares=shares,
                       notices=tuple(sorted((x for n in nodes.values() for x in n.notices), key=lambda x: x.at_us)))


def overview(*, running: bool, start_us: int | None, now_us: int, stored_steps: dict[str, int],
             stored_last_us: int | None, stored_duration_s: float, stored_ranks: dict[str, list[str]],
             stored_loop: tuple[int, int] | None, stored_parts: dict[str, float] | None,
             stored_progress: dict[str, list[Any]], stored_shares: dict[str, dict[str, float]],
             stored_latest: int | None, live: LiveFigures | None) -> Overview:
    """The stored figures, or, where the live counts are ahead (a running job), the live ones. A finished run
    keeps its stored figures; only its progress curve is taken from the live counts when they hold the same
    steps at a finer grain (a short run's rollups have one point a minute)."""
    stored_total = sum(stored_steps.values())
    if live is None or not running:
        progress = stored_progress
        if live is not None and sum(live.steps.values()) == stored_total and \
                len(live.progress["t"]) > len(stored_progress.get("t") or []):
            progress = live.progress
        loop_s = stored_parts["Training loop"] if stored_parts else 0.0
        return Overview(stored_steps, stored_total, stored_duration_s, stored_last_us, stored_ranks, loop_s,
                        stored_parts, progress, stored_shares, stored_latest, None)
    steps = {m: max(stored_steps.get(m, 0), live.steps.get(m, 0)) for m in {*stored_steps, *live.steps}}
    ranks = {n: sorted(set(stored_ranks.get(n, [])) | set(live.ranks.get(n, [])), key=_rank_key)
             for n in {*stored_ranks, *live.ranks}}
    first = min([x for x in (stored_loop[0] if stored_loop else None, live.first_us) if x is not None], default=None)
    last = max([x for x in (stored_loop[1] if stored_loop else None, live.last_us) if x is not None], default=None)
    parts = None
    if first is not None and last is not None and start_us is not None:
        # no finalization while the job runs: the time since the newest step may be the loop going on
        parts = {"Initialization": max(first - start_us, 0) / 1e6, "Training loop": max(last - first, 0) / 1e6}
    progress = live.progress if live.progress["t"] and sum(live.steps.values()) >= stored_total else stored_progress
    latest = max([x for x in (stored_latest, live.latest_step) if x is not None], default=None)
    return Overview(steps=steps, total_steps=sum(steps.values()),
                    duration_s=max(now_us - start_us, 0) / 1e6 if start_us is not None else stored_duration_s,
                    last_us=now_us, ranks=ranks, loop_s=parts["Training loop"] if parts else 0.0, parts_s=parts,
                    progress=progress, phase_shares=live.phase_shares or stored_shares, latest_step=latest,
                    live_us=live.written_us)


def _recent_rate(progress: tuple[tuple[int, int], ...]) -> float | None:
    """Steps per second over the newest RATE_WINDOW_US of a node's progress (None with too little of it)."""
    if len(progress) < 2:
        return None
    t1, n1 = progress[-1]
    older = [p for p in progress[:-1] if t1 - p[0] >= RATE_WINDOW_US]
    t0, n0 = older[-1] if older else progress[0]
    return (n1 - n0) / ((t1 - t0) / 1e6) if t1 > t0 else None


def _merged_progress(curves: list[tuple[tuple[int, int], ...]]) -> dict[str, list[int]]:
    """Steps done by every node together over time (each node's count held between its points)."""
    times = sorted({t for c in curves for t, _ in c})
    if not times:
        return {"t": [], "steps": []}
    idx = [0] * len(curves)
    now = [0] * len(curves)
    total = []
    for t in times:
        for i, c in enumerate(curves):
            while idx[i] < len(c) and c[idx[i]][0] <= t:
                now[i] = c[idx[i]][1]
                idx[i] += 1
        total.append(sum(now))
    if len(times) > PROGRESS_POINTS:
        step = len(times) / PROGRESS_POINTS
        keep = sorted({int(i * step) for i in range(PROGRESS_POINTS)} | {len(times) - 1})
        times, total = [times[i] for i in keep], [total[i] for i in keep]
    return {"t": times, "steps": total}


def _rank_key(rank: str) -> tuple[int, str]:
    return (int(rank), rank) if rank.isdigit() else (2**31, rank)
