"""Ranks side by side, step by step: a rank × step matrix of step time and of data wait. In data-parallel
training every rank's step time looks alike (the collectives make the fast ranks wait), so the matrix shows
*when* steps slowed and *where* the time went: a rank waiting for data, a stretch of slow steps on all ranks.

The matrix is summed cell by cell (`RankCells`), so it can be built from the whole run at once or node by node
an hour at a time (`step_digest`) — the same grid (`StepGrid`) for every part, the same result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from stallwatch.analyze.framework_frame import FrameworkColumns
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


@dataclass(frozen=True)
class StepGrid:
    """The matrix's layout, shared by every part of the run: `mode`'s step numbers from `first` in `cols`
    columns of `per_col` consecutive numbers; `rows` the drawn (node, rank) pairs, in row order."""
    mode: str
    first: int
    last: int
    per_col: int
    cols: int
    rows: tuple[tuple[str, int], ...]
    ranks_total: int


def step_grid(ranges: Mapping[tuple[str, int], tuple[int, int]], *, mode: str = TRAIN,
              max_columns: int = MAX_COLUMNS) -> StepGrid | None:
    """The grid for `mode` from each (node, rank)'s first and last step number of that mode (step numbers
    ≥ 0 only); None without any."""
    if not ranges:
        return None
    keys = sorted(ranges)
    first, last = min(lo for lo, _ in ranges.values()), max(hi for _, hi in ranges.values())
    per_col = max(1, -(-(last - first + 1) // max_columns))
    return StepGrid(mode, first, last, per_col, (last - first) // per_col + 1, tuple(keys[:MAX_RANKS]), len(keys))


def step_ranges(steps: FrameworkColumns, mode: str) -> dict[tuple[str, int], tuple[int, int]]:
    """Each (node, rank)'s first and last step number ≥ 0 of `mode` (`steps` holds step events only)."""
    sel = steps.mode_is([mode]) & (steps.step >= 0)
    out = {}
    for (node, rank), rows in steps.groups(sel, by_mode=False):
        numbers = steps.step[rows]
        out[(str(node), int(rank))] = (int(numbers.min()), int(numbers.max()))
    return out


class RankCells:
    """The step time, step count and data-wait time summed per cell of `grid`, for the grid rows of `nodes`
    (all of them when None): a node's part is a few rows, parts of different nodes `merge` into the matrix."""

    def __init__(self, grid: StepGrid, nodes: set[str] | None = None) -> None:
        self.grid = grid
        self.row_ids = np.array([i for i, (n, _) in enumerate(grid.rows) if nodes is None or n in nodes], np.int64)
        self._local = {grid.rows[i]: j for j, i in enumerate(self.row_ids.tolist())}
        size = len(self.row_ids) * grid.cols
        self.total, self.count, self.waited = np.zeros(size), np.zeros(size, np.int64), np.zeros(size)
        self.waits_seen = False

    def add(self, steps: FrameworkColumns, waits: FrameworkColumns | None) -> None:
        """Steps (step events only) and data waits of this part, any subset at a time."""
        g = self.grid
        sel = steps.mode_is([g.mode]) & (steps.step >= 0)
        if sel.any():
            cell, ok = self._cells(steps, sel)
            duration = (steps.end[sel] - steps.start[sel])[ok].astype(np.float64)
            self.total += np.bincount(cell, weights=duration, minlength=self.total.size)
            self.count += np.bincount(cell, minlength=self.count.size)
        if waits is not None and waits.n:
            wsel = waits.mode_is([g.mode]) & (waits.step >= g.first) & (waits.step <= g.last)
            if wsel.any():
                self.waits_seen = True
                cell, ok = self._cells(waits, wsel)
                duration = (waits.end[wsel] - waits.start[wsel])[ok].astype(np.float64)
                self.waited += np.bincount(cell, weights=duration, minlength=self.waited.size)

    def _cells(self, cols: FrameworkColumns, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each selected row's cell (rows of undrawn ranks left out) and which selected rows those are."""
        g = self.grid
        width = int(max(cols.rank.max(initial=0), max((r for _, r in self._local), default=0))) + 1
        lookup: dict[int, int] = {}
        for code, name in enumerate(cols.nodes):
            for (n, r), j in self._local.items():
                if n == name:
                    lookup[code * width + r] = j
        packed = cols.node[sel] * width + cols.rank[sel]
        keys = np.array(sorted(lookup), np.int64)
        rows = np.full(len(packed), -1, np.int64)
        if len(keys):
            pos = np.minimum(np.searchsorted(keys, packed), len(keys) - 1)
            values = np.array([lookup[k] for k in keys.tolist()], np.int64)
            rows = np.where(keys[pos] == packed, values[pos], -1)
        ok = rows >= 0
        return rows[ok] * g.cols + (cols.step[sel][ok] - g.first) // g.per_col, ok

    def merge(self, other: RankCells) -> None:
        """Add another part's cells (of other rows, or the same rows of other events)."""
        if other.grid != self.grid:
            raise ValueError("cannot merge rank cells of different grids")
        mine = {int(i): j for j, i in enumerate(self.row_ids.tolist())}
        cols = self.grid.cols
        for j, i in enumerate(other.row_ids.tolist()):
            if i not in mine:
                continue
            a, b = mine[i] * cols, j * cols
            self.total[a:a + cols] += other.total[b:b + cols]
            self.count[a:a + cols] += other.count[b:b + cols]
            self.waited[a:a + cols] += other.waited[b:b + cols]
        self.waits_seen |= other.waits_seen

    def result(self) -> RankSteps:
        """The matrices, rows in grid order (rows this part does not cover are NaN)."""
        g = self.grid
        shape = (len(g.rows), g.cols)
        total, count, waited = np.zeros(shape), np.zeros(shape, np.int64), np.zeros(shape)
        total[self.row_ids] = self.total.reshape(-1, g.cols)
        count[self.row_ids] = self.count.reshape(-1, g.cols)
        waited[self.row_ids] = self.waited.reshape(-1, g.cols)
        with np.errstate(invalid="ignore", divide="ignore"):
            step_ms = np.where(count > 0, total / np.maximum(count, 1) / 1000.0, np.nan)
            wait_pct = np.where(total > 0, np.minimum(100.0 * waited / np.maximum(total, 1), 100.0), np.nan)
        names = [f"{n}/{r}" for n, r in g.rows]
        return RankSteps(g.mode, names, g.first, g.per_col, step_ms, wait_pct if self.waits_seen else None,
                         g.ranks_total)


def rank_steps(steps: FrameworkColumns, waits: FrameworkColumns | None, *, mode: str = TRAIN,
               max_columns: int = MAX_COLUMNS) -> RankSteps | None:
    """The matrix for `mode`'s steps (`steps` holds step events only; `waits` the data-wait events), or None
    without steps of that mode. Buckets are equal runs of step numbers, so every rank's step N falls in the
    same column."""
    grid = step_grid(step_ranges(steps, mode), mode=mode, max_columns=max_columns)
    if grid is None:
        return None
    cells = RankCells(grid)
    cells.add(steps, waits)
    return cells.result()
