"""Ranks side by side, step by step: a rank × step matrix of step time and of data wait. In data-parallel
training every rank's step time looks alike (the collectives make the fast ranks wait), so the matrix shows
*when* steps slowed and *where* the time went: a rank waiting for data, a stretch of slow steps on all ranks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stallwatch.analyze.rules.steps import FrameworkColumns
from stallwatch.records import TRAIN

MAX_COLUMNS = 600  # step buckets drawn at most: each cell is one byte, a report stays small
MAX_RANKS = 512  # ranks drawn (the first ones by node and rank); the rest are said, not drawn


@dataclass(frozen=True)
class RankSteps:
    """Per rank (row, "node/rank") and bucket of consecutive step numbers (column): the mean step time in ms
    and the share of step time spent waiting for data in %; NaN where a rank has no step in a bucket."""
    mode: str
    ranks: list[str]
    first_step: int
    steps_per_column: int
    step_ms: np.ndarray  # ranks × columns
    wait_pct: np.ndarray | None  # ranks × columns, None when no data wait was recorded
    ranks_total: int

    @property
    def columns(self) -> int:
        return self.step_ms.shape[1]


def rank_steps(steps: FrameworkColumns, waits: FrameworkColumns | None, *, mode: str = TRAIN,
               max_columns: int = MAX_COLUMNS) -> RankSteps | None:
    """The matrix for `mode`'s steps (`steps` holds step events only; `waits` the data-wait events), or None
    without steps of that mode. Buckets are equal runs of step numbers, so every rank's step N falls in the
    same column."""
    sel = steps.mode_is([mode]) & (steps.step >= 0)
    if not sel.any():
        return None
    node, rank, number = steps.node[sel], steps.rank[sel], steps.step[sel]
    duration = (steps.end[sel] - steps.start[sel]).astype(np.float64)
    keys = np.unique(np.stack([node, rank], axis=1), axis=0)
    order = sorted(range(len(keys)), key=lambda i: (steps.nodes[keys[i][0]], int(keys[i][1])))
    keys = keys[order][:MAX_RANKS]
    first, last = int(number.min()), int(number.max())
    per_col = max(1, -(-(last - first + 1) // max_columns))
    cols = (last - first) // per_col + 1
    rows = _rows(node, rank, keys)
    keep = rows >= 0
    cell = rows[keep] * cols + (number[keep] - first) // per_col
    size = len(keys) * cols
    total = np.bincount(cell, weights=duration[keep], minlength=size)
    count = np.bincount(cell, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        step_ms = np.where(count > 0, total / np.maximum(count, 1) / 1000.0, np.nan).reshape(len(keys), cols)
    wait_pct = None
    if waits is not None and waits.n:
        wsel = waits.mode_is([mode]) & (waits.step >= first) & (waits.step <= last)
        if wsel.any():
            wnode = np.array([steps.nodes.index(waits.nodes[c]) if waits.nodes[c] in steps.nodes else -1
                              for c in range(len(waits.nodes))], np.int64)[waits.node[wsel]]
            wrows = _rows(wnode, waits.rank[wsel], keys)
            ok = wrows >= 0
            wcell = wrows[ok] * cols + (waits.step[wsel][ok] - first) // per_col
            waited = np.bincount(wcell, weights=(waits.end[wsel] - waits.start[wsel])[ok].astype(np.float64),
                                 minlength=size)
            with np.errstate(invalid="ignore", divide="ignore"):
                wait_pct = np.where(total > 0, np.minimum(100.0 * waited / np.maximum(total, 1), 100.0),
                                    np.nan).reshape(len(keys), cols)
    names = [f"{steps.nodes[n]}/{r}" for n, r in keys]
    ranks_total = len(np.unique(np.stack([node, rank], axis=1), axis=0))
    return RankSteps(mode, names, first, per_col, step_ms, wait_pct, ranks_total)


def _rows(node: np.ndarray, rank: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Row of each (node, rank) pair among `keys` (-1 when not drawn), vectorised."""
    width = int(max(rank.max(initial=0), keys[:, 1].max(initial=0))) + 1
    packed_keys = keys[:, 0].astype(np.int64) * width + keys[:, 1]
    packed = node.astype(np.int64) * width + rank
    order = np.argsort(packed_keys)
    pos = np.searchsorted(packed_keys[order], packed)
    pos = np.minimum(pos, len(order) - 1)
    found = packed_keys[order][pos] == packed
    return np.where(found, order[pos], -1)
