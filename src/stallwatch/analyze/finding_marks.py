"""Where the top findings happened, as timeline overlays: each finding's time windows as labelled spans and its
step numbers as markers at the steps' starts — so the timeline shows where the first thing to fix happened
(InputBound's window, Straggler's steps, a Hang's time, MemoryGrowth's steps), not only the outlier steps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stallwatch.analyze.finding import Finding
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.series import Marker, Span
from stallwatch.records import TRAIN
from stallwatch.timeutil import format_us

TOP = 3  # the findings marked: what to fix first, not every finding
MAX_WINDOWS = 20  # per finding (rules list up to LISTED_WINDOWS)
MAX_STEPS = 20  # per finding


def label(rank: int, finding: Finding) -> str:
    """The legend entry of a finding's marks: its place in the ranking and its rule."""
    return f"Finding {rank}: {finding.rule}"


def finding_marks(findings: Sequence[Finding], steps: FrameworkColumns | None,
                  top: int = TOP) -> tuple[list[Span], list[Marker]]:
    """The first `top` findings' windows (spans), or, for a finding without windows, its steps (markers at each
    step's earliest start on the ranks the finding names, or on any rank when it names none). `steps`: the step events; None leaves steps out (a
    run read from rollups)."""
    spans: list[Span] = []
    markers: list[Marker] = []
    for i, f in enumerate(findings[:top], 1):
        name = label(i, f)
        for a, b in list(dict.fromkeys(map(tuple, f.where.windows)))[:MAX_WINDOWS]:
            spans.append(Span(int(a), max(int(b), int(a) + 1), name,
                              f"{f.title}: {format_us(int(a))} → {format_us(int(b))}"))
        if steps is not None and f.where.steps and not f.where.windows:  # windows say it already: one mark each
            for n, at in _step_starts(steps, f.where.steps[:MAX_STEPS], f.where.ranks).items():
                markers.append(Marker(at, name, f"{f.title}: step {n}"))
    return spans, markers


def _step_starts(steps: FrameworkColumns, numbers: Sequence[int], ranks: Sequence[str]) -> dict[int, int]:
    """Step number -> its earliest start (µs) over the named ranks ("node/rank"; all when none are named), of
    the training steps where those numbers exist."""
    if steps.n == 0:
        return {}
    mask = np.isin(steps.step, np.asarray(list(numbers), dtype=np.int64))
    train = mask & steps.mode_is([TRAIN])
    if train.any():  # each mode counts its own steps: a finding's steps are training steps unless only others match
        mask = train
    if ranks:
        names = np.asarray([f"{steps.nodes[c]}/{r}" for c, r in zip(steps.node[mask], steps.rank[mask])], dtype=object)
        keep = np.isin(names, np.asarray(list(ranks), dtype=object)) if len(names) else np.zeros(0, bool)
        idx = np.flatnonzero(mask)[keep]
        if idx.size == 0:  # the ranks are named otherwise (a node alone): any rank's step
            idx = np.flatnonzero(mask)
    else:
        idx = np.flatnonzero(mask)
    out: dict[int, int] = {}
    for n, start in zip(steps.step[idx].tolist(), steps.start[idx].tolist()):
        out[int(n)] = min(out.get(int(n), int(start)), int(start))
    return dict(sorted(out.items()))
