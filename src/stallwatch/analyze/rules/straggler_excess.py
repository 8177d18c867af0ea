"""Straggler's measure: how much longer each rank's steps took than the others' (its excess over the median of the
other ranks, step by step), the time at stake, and what a finished rank keeps of its steps (`_Summary`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stallwatch.analyze.rules.kit.stats import column_medians


@dataclass(frozen=True)
class _Summary:
    """What is kept of a finished rank when the run will be read again: its step numbers as runs, whether its
    collectives and backward passes cover most of its steps (`_basis`), and per span of SPAN consecutive step
    numbers the first and last start of its events of those numbers (rows of span, first µs, last µs): where the
    replay finds them (≈ 24 bytes per SPAN steps, whatever the events' order or a numbering that restarts)."""

    runs: np.ndarray
    coll: bool
    bwd: bool
    spans: np.ndarray


SPAN = 1024  # step numbers per span of a rank's `_Summary`


def _stake(excess: np.ndarray, fired: np.ndarray) -> float:
    """The sum over a block's columns of the largest positive excess among the `fired` rows (µs)."""
    chosen = np.where(fired[:, None], np.maximum(excess, 0), np.nan)
    with np.errstate(all="ignore"):  # steps where no straggler has a value: NaN, left out of the sum
        per_step = np.nanmax(chosen, axis=0, initial=-np.inf, where=~np.isnan(chosen))
    return float(np.sum(per_step[np.isfinite(per_step)]))


def own_outside(dur: np.ndarray, outside: np.ndarray, runq: np.ndarray | None,
                basis: str) -> tuple[np.ndarray, np.ndarray]:
    """A rank's time outside waits and its step, less the time its training thread waited for a CPU (`runq`, µs; the
    machine's slowness is CPUContention's, not the rank's). A thread waiting in a collective sleeps, so with the
    collectives taken out (or nothing) the delay falls outside them, whole; with the backward pass taken out
    (DDP reduces inside it, computing too) it is spread over the step, the outside part losing its share."""
    if runq is None:
        return outside, dur
    runq = np.minimum(runq.astype(np.float64), dur)
    if basis == "backward":
        with np.errstate(invalid="ignore", divide="ignore"):
            lost = np.where(dur > 0, runq * outside / np.maximum(dur, 1.0), 0.0)
    else:
        lost = np.minimum(runq, outside)
    return np.maximum(outside - np.round(lost), 0.0), dur - runq


LEAVE_ONE_OUT_UP_TO = 16  # ranks: each is compared with the median of the *others* (with two ranks, the other one)


def _excess(matrix: np.ndarray) -> np.ndarray:
    """Each rank's time outside waits minus that of the others at the same step: the median of the other ranks
    for small jobs (with two ranks the median of both would halve the difference), of all ranks for large ones."""
    with np.errstate(all="ignore"):
        if len(matrix) > LEAVE_ONE_OUT_UP_TO:
            return matrix - column_medians(matrix)
        return np.stack([matrix[i] - column_medians(np.delete(matrix, i, axis=0)) for i in range(len(matrix))])
