"""The system rules' kit: a node's snapshots cut into windows by position (never by when `update()` is called),
the windows a rule flagged, and nodes without the data a rule needs (Details["not_applicable"]).

All the GPU rules skip the first `patience` snapshots of each node. The window rules cut what follows into
consecutive, non-overlapping windows of `window` snapshots, per node, by position in the node's snapshot sequence, so
one chunk or many give the same windows. A trailing window shorter than `window` is evaluated once, by the chunk that
has `final` set, and only by the rules that allow partial windows (LowGPUUtilization and BatchSize).

Whole-run statistics need every value: the rules keep each reported series as a `Distribution` (kit/stats.py). A node
without GPU data is not applicable (Details["not_applicable"]); a run without any makes the whole rule not
applicable. Details are keyed by node as SageMaker's were (`Details[node][gpu]`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from stallwatch.analyze.rules.base import NodeFrame, Rule, RuleResult
from stallwatch.analyze.rules.kit.checks import skip_patience
from stallwatch.analyze.rules.kit.details import DetailsRecord
from stallwatch.records import COLUMN_SEP


def gpu_series(frame: NodeFrame, metric: str) -> dict[str, np.ndarray]:
    """{"gpu0/metric": values, …} for the node's numbered GPUs, in number order."""
    return {f"{d}{COLUMN_SEP}{metric}": frame.columns[f"{d}{COLUMN_SEP}{metric}"] for d in frame.devices("gpu", metric)}


def device_of(column: str) -> str:
    return column.partition(COLUMN_SEP)[0]


def _device_number(column: str) -> int:
    digits = "".join(ch for ch in device_of(column) if ch.isdigit())
    return int(digits) if digits else -1


@dataclass
class Block:
    """Whole windows of one node ready to evaluate: `n_full` windows of `window` snapshots, then (only
    in the final chunk) one partial window of `partial` snapshots. `cols` maps column -> values."""

    timestamps: np.ndarray
    cols: dict[str, np.ndarray]
    window: int
    n_full: int
    partial: int

    @property
    def n_windows(self) -> int:
        return self.n_full + (1 if self.partial else 0)

    @property
    def size(self) -> int:
        return len(self.timestamps)

    def starts(self) -> np.ndarray:
        """Timestamp of the first snapshot of each window."""
        return self.timestamps[0: self.n_windows * self.window: self.window]

    def ends(self) -> np.ndarray:
        """Timestamp of the last snapshot of each window."""
        ends = self.timestamps[self.window - 1: self.n_full * self.window: self.window]
        if self.partial:
            ends = np.append(ends, self.timestamps[-1])
        return ends

    def percentiles(self, x: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
        """(n_windows, len(qs)) percentiles of each window (NaN ignored; NaN for an all-NaN window)."""
        out = np.full((self.n_windows, len(qs)), np.nan)
        w, nf = self.window, self.n_full
        if nf:
            full = x[: nf * w].reshape(nf, w)
            holes = np.isnan(full).any(axis=1)
            if not holes.any():
                out[:nf] = np.percentile(full, qs, axis=1).T
            else:
                clean = ~holes
                if clean.any():
                    out[:nf][clean] = np.percentile(full[clean], qs, axis=1).T
                for i in np.flatnonzero(holes):  # windows with gaps: few
                    out[i] = _percentiles_1d(full[i], qs)
        if self.partial:
            out[-1] = _percentiles_1d(x[nf * w:], qs)
        return out

    def means(self, x: np.ndarray) -> np.ndarray:
        """Mean of each full window (NaN ignored; NaN for an all-NaN window); partial windows excluded."""
        nf, w = self.n_full, self.window
        full = x[: nf * w].reshape(nf, w)
        ok = ~np.isnan(full)
        counts = ok.sum(axis=1)
        sums = np.where(ok, full, 0.0).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _percentiles_1d(x: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    v = x[~np.isnan(x)]
    if v.size == 0:
        return np.full(len(qs), np.nan)
    return np.percentile(v, qs)


class Windows:
    """One node's snapshots after patience, cut into consecutive windows of `window` snapshots.

    `feed()` takes the node's new snapshots (any number, any chunking) and returns the windows they
    complete; fewer than `window` leftover snapshots wait for the next chunk, unless `flush` (the final
    chunk) asks for them as one partial window. Columns may appear or vanish between chunks: a column
    missing from some snapshots reads NaN there, exactly as in a whole-run frame."""

    def __init__(self, patience: int, window: int) -> None:
        self.patience, self.window = patience, window
        self.seen = 0
        self.ts = np.empty(0, np.int64)
        self.cols: dict[str, np.ndarray] = {}

    def feed(self, timestamps: np.ndarray, cols: dict[str, np.ndarray], *, flush: bool,
             partial_ok: bool = True) -> Block | None:
        n = len(timestamps)
        skip = skip_patience(self.seen, n, self.patience)
        self.seen += n
        ts = timestamps[skip:]
        new = {k: v[skip:] for k, v in cols.items()}
        if len(self.ts):
            old_n, add_n = len(self.ts), len(ts)
            merged = {}
            for k in [*self.cols, *(k for k in new if k not in self.cols)]:
                a = self.cols.get(k)
                b = new.get(k)
                merged[k] = np.concatenate([a if a is not None else np.full(old_n, np.nan),
                                            b if b is not None else np.full(add_n, np.nan)])
            ts = np.concatenate([self.ts, ts])
            new = merged
        total = len(ts)
        n_full = total // self.window
        used = n_full * self.window
        partial = total - used if flush and partial_ok else 0
        rest = used + partial
        if flush:  # nothing more comes: a partial window not evaluated now never is
            self.ts, self.cols = np.empty(0, np.int64), {}
        else:
            self.ts = ts[rest:].copy()
            self.cols = {k: v[rest:].copy() for k, v in new.items()}
        if rest == 0:
            return None
        return Block(ts[:rest], {k: v[:rest] for k, v in new.items()}, self.window, n_full, partial)


def ordered_columns(cols: dict[str, Any]) -> list[str]:
    return sorted(cols, key=lambda c: (_device_number(c), c))


def not_applicable_nodes(nodes: dict[str, Any], what: str) -> dict[str, str]:
    return {node: f"no {what} recorded on node {node}" for node in sorted(nodes) if not nodes[node].has_gpu}


def note_skipped(details: dict[str, Any], nodes: dict[str, Any], what: str = "GPU data") -> str:
    """Nodes without `what` into Details["not_applicable"]; the result's Message saying so ("" when none)."""
    skipped = not_applicable_nodes(nodes, what)
    if not skipped:
        return ""
    details["not_applicable"] = skipped
    return f"skipped nodes without {what}: {', '.join(skipped)}"


def all_not_applicable(rule: Rule, nodes: dict[str, Any], what: str = "GPU data") -> RuleResult:
    if not nodes:
        reason = "no system data: no node reported any snapshot"
    else:
        reason = (f"no {what} on any node ({', '.join(sorted(nodes))}): {rule.name} needs GPUs, "
                  f"this run is CPU-only")
    return rule.not_applicable(reason, {"reason": reason, "not_applicable": not_applicable_nodes(nodes, what)
                                        if nodes else {}})


def take_node(mine: dict[str, Any], theirs: dict[str, Any], node: str, seen: Callable[[Any], int]) -> None:
    """`merge` for a rule whose state is all per node (no run-wide accumulator): `node`'s state from `theirs` (a
    rule fed only that node's chunks, the others as empty frames) replaces `mine`'s, which saw at most empty
    frames of it. Its windows and patience count from the node's first snapshot, so they cannot be joined to
    rows `mine` already had: that is refused, not guessed. `seen(state)`: the node's snapshots so far."""
    if node not in theirs:
        return
    if node in mine and seen(mine[node]):
        raise ValueError(f"node {node} was fed to both rules: its windows cannot be joined")
    mine[node] = theirs[node]  # a key already there keeps its place


MAX_WINDOWS = 100  # flagged windows listed per node in Details (all are counted)


@dataclass
class Flagged:
    """A node's flagged windows in time order: the first MAX_WINDOWS as [start_us, end_us, [devices]] (the
    timestamps of their first and last snapshots), and how many there were."""
    windows: list[list[Any]] = field(default_factory=list)
    total: int = 0

    def add(self, block: Block, flags: dict[str, np.ndarray]) -> None:
        """`flags`: per device, which of the block's windows it flagged."""
        if not flags:
            return
        any_flag = np.logical_or.reduce(list(flags.values()))
        hits = np.flatnonzero(any_flag)
        self.total += int(hits.size)
        room = MAX_WINDOWS - len(self.windows)
        if room <= 0 or hits.size == 0:
            return
        starts, ends = block.starts(), block.ends()
        for k in hits[:room].tolist():
            self.windows.append([int(starts[k]), int(ends[k]), [d for d, f in flags.items() if f[k] and d]])


def flagged_details(nodes: dict[str, Any]) -> dict[str, Any]:
    """Details["flagged_windows"]: every node's listed windows in time order, and the total."""
    windows = [{"node": node, "start_us": a, "end_us": b, "devices": devices}
               for node in sorted(nodes) for a, b, devices in nodes[node].flagged.windows]
    windows.sort(key=lambda w: (w["start_us"], w["node"]))
    return {"windows": windows, "total": sum(nodes[n].flagged.total for n in nodes)}


@dataclass(frozen=True)
class FlaggedWindow(DetailsRecord):
    """One flagged window of a node: the timestamps (µs since the epoch) of its first and last snapshot, and the
    devices ("gpu0", …) that flagged it."""

    node: str = ""
    start_us: int = 0
    end_us: int = 0
    devices: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FlaggedWindows(DetailsRecord):
    """Details["flagged_windows"]: every node's listed windows in time order (MAX_WINDOWS per node) and how many
    were flagged in all."""

    windows: list[FlaggedWindow] = field(default_factory=list)
    total: int = 0

    @property
    def nodes(self) -> list[str]:
        return sorted({w.node for w in self.windows})

    def spans(self) -> list[tuple[int, int]]:
        return [(w.start_us, w.end_us) for w in self.windows]
