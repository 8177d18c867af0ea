"""Straggler on a run too large to hold: the ranks' steps read again from the run, a block of step numbers at a time
(`Chunk.replay`), and compared as in memory, with the same result byte for byte."""

from __future__ import annotations

import warnings
from typing import Iterator

import numpy as np

from stallwatch.analyze import contention
from stallwatch.analyze.framework_frame import FrameworkColumns, new_events
from stallwatch.analyze.rules import straggler_excess
from stallwatch.analyze.rules.base import Replay
from stallwatch.analyze.rules.kit.stats import column_medians
from stallwatch.analyze.rules.straggler_excess import LEAVE_ONE_OUT_UP_TO, _excess, _stake, _Summary, own_outside
from stallwatch.records import BACKWARD, COLLECTIVE, STEP, TRAIN

REPLAY_CELLS = 1 << 23  # ranks × step numbers read again at once (16 bytes a cell: the block's two matrices)
NODE_CELLS = 1 << 17  # one node's ranks × step numbers in a piece (≈ 250 bytes a cell while its rows are read)


class _Replayed:
    """`_Grid` for ranks kept as `_Summary`s: the shared step numbers come from their runs, and `blocks()` reads
    the run again (`Chunk.replay`) a block of step numbers at a time: for each node, the time its ranks' events of
    those numbers span, so the result holds a block of ranks × numbers instead of every rank-step of the run,
    however far apart in time the ranks reach a number. `starts` is complete once a `blocks()` pass has ended.
    The same columns as `_Grid`'s, so the same result."""

    def __init__(self, ranks: list[tuple[tuple[str, int], _Summary]], basis: str, replay: Replay,
                 of: _Replayed | None = None) -> None:
        """`of`: a grid of more ranks whose columns (and, for many ranks, medians) these ranks are compared with."""
        self.index = {key: i for i, (key, _) in enumerate(ranks)}
        self.ranks, self.replay, self.of = len(ranks), replay, of
        if of is None:
            self.numbers = _shared([s.runs for _, s in ranks])
            self.starts = np.full(len(self.numbers), np.iinfo(np.int64).max, np.int64)
            # with many ranks, each column's median time outside waits (what excess is measured from)
            self.centers = np.full(len(self.numbers), np.nan) if len(ranks) > LEAVE_ONE_OUT_UP_TO else None
        else:
            self.numbers, self.starts, self.centers = of.numbers, of.starts, of.centers
        self.basis = basis
        self.wait = {"collectives": COLLECTIVE, "backward": BACKWARD}.get(basis)
        by_node: dict[str, list[tuple[int, int]]] = {}
        for (node, rank), i in self.index.items():
            by_node.setdefault(node, []).append((rank, i))
        self._ranks = {node: tuple(np.array(column, np.int64) for column in zip(*sorted(pairs)))
                       for node, pairs in by_node.items()}  # per node: its ranks (sorted) and their rows
        nodes = sorted({node for (node, _), _ in ranks})
        code = {node: k for k, node in enumerate(nodes)}
        rows = [np.c_[np.full(len(s.spans), code[node]), s.spans] for (node, _), s in ranks if len(s.spans)]
        self._nodes, self._spans = nodes, (np.concatenate(rows) if rows else np.zeros((0, 4), np.int64))

    def plan(self) -> list[tuple[int, int, list[tuple[str, int, int]]]]:
        """What a pass reads, in order: (first number, end number, [(node, start µs, end µs)]) per block of
        spans that hold shared numbers, at most REPLAY_CELLS ranks × numbers each, NODE_CELLS of one node's."""
        if not len(self.numbers):
            return []
        first = self.of or self  # a pass over a few ranks reads as the first did: its pieces as big
        most = max((len(numbers) for numbers, _ in first._ranks.values()), default=1)  # ranks of a node
        span = straggler_excess.SPAN  # read when called: a test may set it
        per = max(1, min(REPLAY_CELLS // max(first.ranks, 1), NODE_CELLS // most) // span)  # spans per block
        wanted = np.unique(self.numbers // span)
        rows = self._spans[np.isin(self._spans[:, 1], wanted)]
        block = rows[:, 1] // per
        order = np.lexsort((rows[:, 0], block))
        rows, block = rows[order], block[order]
        key = np.r_[True, (block[1:] != block[:-1]) | (rows[1:, 0] != rows[:-1, 0])]
        at = np.flatnonzero(key)
        lo, hi = np.minimum.reduceat(rows[:, 2], at), np.maximum.reduceat(rows[:, 3], at)
        out: list[tuple[int, int, list[tuple[str, int, int]]]] = []
        for k, b in enumerate(block[at].tolist()):
            if not out or out[-1][0] != b * per * span:
                out.append((b * per * span, (b + 1) * per * span, []))
            out[-1][2].append((self._nodes[int(rows[at[k], 0])], int(lo[k]), int(hi[k]) + 1))
        return out

    def rank_rows(self, cols: FrameworkColumns, rows: np.ndarray) -> np.ndarray:
        """The grid's row of each of `rows`' (node, rank), -1 for a rank it does not compare."""
        out = np.full(len(rows), -1, np.int64)
        node, rank = cols.node[rows], cols.rank[rows]
        # a replayed piece is one node's: one code, no grouping (finding the codes cost as much as the rest)
        codes = range(len(cols.nodes)) if len(cols.nodes) == 1 else np.unique(node).tolist()
        for code in codes:
            mine = slice(None) if len(cols.nodes) == 1 else node == code
            ranks = self._ranks.get(cols.nodes[code])
            if ranks is None:
                continue
            numbers, where = ranks
            theirs = rank[mine]
            if 0 <= numbers[0] and numbers[-1] < 1 << 16:  # ranks numbered as usual: a table lookup
                table = np.full(int(numbers[-1]) + 2, -1, np.int64)  # the last entry: any rank past the table
                table[numbers] = where
                out[mine] = table[np.clip(theirs, -1, len(table) - 1)]  # -1 (also the last entry): not compared
            else:
                pos = np.minimum(np.searchsorted(numbers, theirs), len(numbers) - 1)
                out[mine] = np.where(numbers[pos] == theirs, where[pos], -1)
        return out

    def excess(self, matrix: np.ndarray, a: int) -> np.ndarray:
        """`_excess` of columns [a, a + width): from the medians of all ranks kept by the first pass when there are
        many (so a pass over a few ranks measures them as the first did), else from the others' median."""
        if self.centers is None:
            return _excess(matrix)
        b = a + matrix.shape[1]
        if self.of is None:
            self.centers[a:b] = column_medians(matrix)
        return matrix - self.centers[a:b]

    def stake(self, fired: list[tuple[tuple[str, int], _Summary]], basis: str, width: int) -> float:
        """The time at stake of the straggling ranks `fired` (µs): their largest positive excess, summed over the
        columns. With many ranks, a pass over the straggling ranks' nodes only, measured from the kept medians."""
        keys = {key for key, _ in fired}
        grid = self if self.centers is None else _Replayed(fired, basis, self.replay, of=self)
        rows = np.array([key in keys for key in grid.index])  # index keys are in row order
        return sum((_stake(excess, rows) for _, _, excess in grid.blocks(width)), 0.0)

    def blocks(self, width: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(first column, median step, excess) per block of at most `width` columns, in order."""
        plan = self.plan()
        kinds = (STEP,) if self.wait is None else (STEP, self.wait)
        chunks = self.replay([piece for _, _, pieces in plan for piece in pieces], kinds=kinds,
                             fields=("kind", "mode", "step", "end_us", "args"))  # args: each step's runq_us
        columns = _Columns(self, width)
        for lo, hi, pieces in plan:
            a, b = (int(x) for x in np.searchsorted(self.numbers, [lo, hi]))
            yield from columns.emit(a)
            columns.open(a, b)
            for _ in pieces:
                columns.take(new_events(next(chunks)), lo, hi)
            yield from columns.emit(b)
        yield from columns.emit(len(self.numbers))


def _by_key_then_start(key: np.ndarray, start: np.ndarray) -> np.ndarray:
    """`np.lexsort((start, key))`: one stable sort of a single int64 made of both where they fit in one (the
    replay's pieces: a block's cells and a few hours of µs), ≈ 8× faster than two sorts."""
    if not len(key):
        return np.empty(0, np.intp)
    k, t = key - key.min(), start - start.min()
    shift = int(t.max()).bit_length()
    if int(k.max()).bit_length() + shift > 62:
        return np.lexsort((start, key))
    return np.argsort(k << shift | t, kind="stable")


def _shared(runs: list[np.ndarray]) -> np.ndarray:
    """The step numbers in at least two ranks' runs, sorted."""
    rows = [r for r in runs if len(r)]
    if not rows:
        return np.empty(0, np.int64)
    both = np.concatenate(rows)
    edges, where = np.unique(np.r_[both[:, 0], both[:, 0] + both[:, 1]], return_inverse=True)
    change = np.zeros(len(edges), np.int64)
    np.add.at(change, where, np.r_[np.ones(len(both), np.int64), -np.ones(len(both), np.int64)])
    count = np.cumsum(change)[:-1]  # ranks holding each number of [edges[i], edges[i + 1])
    pick = np.flatnonzero(count >= 2)
    lengths = edges[pick + 1] - edges[pick]
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(edges[pick], lengths) + np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets, lengths)


class _Columns:
    """One replay pass turned into the columns of `_Grid.blocks`: a block of step numbers is filled piece by piece
    (a piece holds all of one node's events of those numbers: each rank's step of each number is settled from it,
    its first row's duration less the waits of that number), into two ranks × numbers matrices of the block (16
    bytes a cell, what bounds `REPLAY_CELLS`); once the block's pieces are in, its columns are handed out."""

    def __init__(self, grid: _Replayed, width: int) -> None:
        self.grid, self.width = grid, width
        self.emitted = 0  # columns [0, emitted) handed out
        self.base = 0  # the block's first column
        self.outside = self.steps = np.full((grid.ranks, 0), np.nan)  # the block's: time outside waits, step, µs

    def open(self, a: int, b: int) -> None:
        """The block of columns [a, b), empty (columns before `a` handed out first)."""
        self.base = a
        self.outside = np.full((self.grid.ranks, b - a), np.nan)
        self.steps = np.full((self.grid.ranks, b - a), np.nan)

    def take(self, cols: FrameworkColumns | None, lo: int, hi: int) -> None:
        """A piece's TRAIN steps and waits of step numbers [lo, hi), of the grid's ranks and columns, settled."""
        if cols is None:
            return
        g = self.grid
        block = g.numbers[self.base:self.base + self.outside.shape[1]]  # the block's numbers: those in [lo, hi)
        if not len(block):
            return
        rows = np.flatnonzero(cols.mode_is([TRAIN]) & (cols.step >= lo) & (cols.step < hi))
        step = cols.step[rows]
        rank = g.rank_rows(cols, rows)
        if int(block[-1]) - int(block[0]) == len(block) - 1:  # consecutive numbers (the usual case): an offset
            column = step - block[0]
            keep = (rank >= 0) & (column >= 0) & (column < len(block))
        else:
            column = np.searchsorted(block, step)  # within the block: a search that stays in cache
            keep = (rank >= 0) & (block[np.minimum(column, len(block) - 1)] == step)
        column += self.base
        if not keep.all():
            rows, rank, column = rows[keep], rank[keep], column[keep]
        start = cols.start[rows]
        duration = np.maximum(cols.end[rows] - start, 0)
        kind = cols.kind_is(STEP)[rows]
        if not kind.any():
            return
        key = rank[kind] * len(g.numbers) + column[kind]
        start, dur = start[kind], duration[kind]
        runq = contention.step_runq(cols, rows[kind])
        order = _by_key_then_start(key, start)
        first = order[np.r_[True, np.diff(key[order]) != 0]]  # each rank's first step of each number
        mine, fs, fd, fq = key[first], start[first], dur[first], runq[first]  # sorted by rank, then column
        wait = np.zeros(len(mine), np.int64)
        if g.wait is not None:
            kind = cols.kind_is(g.wait)[rows]
            keys = rank[kind] * len(g.numbers) + column[kind]
            pos = np.minimum(np.searchsorted(mine, keys), len(mine) - 1)
            hit = mine[pos] == keys
            if hit.any():  # µs sums far below 2**53: exact in the float64 weights
                wait += np.bincount(pos[hit], weights=duration[kind][hit], minlength=len(mine)).astype(np.int64)
        fr, fc = np.divmod(mine, len(g.numbers))
        np.minimum.at(g.starts, fc, fs)
        outside = np.maximum(fd - wait, 0) if g.wait is not None else np.maximum(fd, 0)
        out, own = own_outside(fd.astype(np.float64), outside.astype(np.float64), fq if fq.any() else None, g.basis)
        self.outside[fr, fc - self.base] = out
        self.steps[fr, fc - self.base] = own

    def emit(self, upto: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Hand out columns [emitted, upto), `width` at a time: the block's, or none (NaN) before it."""
        g = self.grid
        while self.emitted < upto:
            a = self.emitted
            inside = self.base <= a < self.base + self.outside.shape[1]
            b = min(upto, a + self.width, self.base + self.outside.shape[1] if inside else
                    (self.base if a < self.base else upto))
            if inside:
                matrix, steps = self.outside[:, a - self.base:b - self.base], self.steps[:, a - self.base:b - self.base]
            else:
                matrix = steps = np.full((g.ranks, b - a), np.nan)
            self.emitted = b
            with warnings.catch_warnings():  # a pass over a few ranks has columns where none of them has a value
                warnings.simplefilter("ignore", RuntimeWarning)
                median = column_medians(steps)
                excess = g.excess(matrix, a)
            yield a, median, excess
