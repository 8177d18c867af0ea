"""InputBound's judgement of one rank, from its steps in step order: the same numbers whether they were held in
memory (`input_bound`) or the node was read again (`input_stream`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stallwatch.analyze import contention

US = 1_000_000
STALL_FACTOR = 10.0  # a wait this many times the rank's median wait is a stall, if it also costs
# at least this share of a typical step: a scheduler's hiccup of a millisecond is not a slow read (with 5 %, a loaded
# 2-core machine named 7 such "stalls" beside 12 planted reads of 0.3 s)
STALL_STEP_SHARE = 0.5
STALL_SHARE = 0.5  # stalls are the cause when they hold at least half of the waiting
MAX_NAMED = 20  # stall steps named per rank


MIN_SHORT_RUN_STEPS = 20  # after patience: fewer steps than a window are judged as one window from this many


@dataclass(frozen=True)
class RankFacts:
    """What a rank's entry is computed from: the same numbers whether its steps were held in memory (`rank_facts`)
    or its node was read again (`input_stream`)."""

    n: int
    wait_us: int  # waits summed (each step's capped at the step)
    step_us: int
    body: int  # steps before the windows (patience)
    worst: dict[str, Any] | None  # the window with the largest waiting share
    above: int  # windows above the threshold (0 for a run too short to judge)
    stalls: dict[str, Any] | None  # median_wait_ms, stalls, stall_wait_s; None when it never waited
    named: list[int]  # the longest stalls' step numbers (when they are the cause)
    stalled: bool  # stalls hold at least STALL_SHARE of the waiting


def settled_steps(dur: np.ndarray, wait: np.ndarray, runq: np.ndarray | None, in_wait: np.ndarray | None,
                  workers: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """Steps as InputBound judges them, held in memory or read again: own times, waits, the least of each wait that
    was the loader's (which stalls are judged on), and the own times before the workers' delay is taken out (what
    a stall is measured against: read in one pass, before the node's snapshots are all in)."""
    floor = wait
    if runq is not None and runq.any():
        dur, wait, floor = contention.own_waits(dur, wait, runq, in_wait)
    plain = dur
    if workers is not None and workers.any():
        dur, wait, floor = contention.less_workers_delay(dur, wait, floor, workers)
    return dur, wait, floor, plain


def rank_facts(number: np.ndarray, start: np.ndarray, dur: np.ndarray, wait: np.ndarray, *, window: int,
               patience: int, threshold: float, runq: np.ndarray | None = None,
               in_wait: np.ndarray | None = None, workers: np.ndarray | None = None) -> RankFacts:
    """A rank's facts from its steps in step order (`_Rank.steps()`); with `runq` (each step's run-queue delay),
    judged on the steps' own time (analyze/contention.py): waiting for a CPU is not waiting for data; with `workers`
    (`contention.workers_delay`), neither is the loader's workers' wait for a CPU other processes held."""
    n = len(number)
    dur, wait, floor, plain = settled_steps(dur, wait, runq, in_wait, workers)
    body = slice(min(patience, n), n)
    w, d = wait[body], dur[body]
    above = 0
    worst = None
    if len(d) >= 1:
        k = min(window, len(d))
        cw, cd = np.r_[0, np.cumsum(w)], np.r_[0, np.cumsum(d)]
        wsum, dsum = cw[k:] - cw[:-k], cd[k:] - cd[:-k]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(dsum > 0, 100.0 * wsum / np.maximum(dsum, 1), 0.0)
        # A run shorter than a window is one window (a 96-step job waiting 99 % of its time is
        # input-bound), once it has enough steps to say so.
        judged = len(d) >= window or len(d) >= MIN_SHORT_RUN_STEPS
        above = int(np.count_nonzero(share > threshold)) if judged else 0
        i = int(np.argmax(share))
        a, b = body.start + i, body.start + i + k - 1
        worst = {"share": float(share[i]), "first_step": int(number[a]), "last_step": int(number[b]),
                 "start_us": int(start[a]), "end_us": int(start[b] + dur[b]), "steps": k}
    stalls, named, stalled = None, [], False
    waiting = wait[wait > 0]
    if waiting.size:
        # a few long stalls (the first steps, where workers start, are start-up, not stalls)
        median = float(np.median(waiting))
        is_stall = (floor > STALL_FACTOR * median) & (floor > STALL_STEP_SHARE * np.median(plain))
        is_stall[:body.start if body.start < n else 0] = False
        stall_wait = float(floor[is_stall].sum())
        stalls = {"median_wait_ms": median / 1000.0, "stalls": int(is_stall.sum()), "stall_wait_s": stall_wait / US}
        if is_stall.any() and stall_wait >= STALL_SHARE * float(wait.sum()):
            order = np.argsort(-floor[is_stall], kind="stable")[:MAX_NAMED]
            named, stalled = sorted(int(x) for x in number[is_stall][order]), True
    return RankFacts(n=n, wait_us=int(wait.sum()), step_us=int(dur.sum()), body=body.start, worst=worst,
                     above=above, stalls=stalls, named=named, stalled=stalled)
