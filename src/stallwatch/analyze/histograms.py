"""Histograms the notebook views draw (as the deep-profiling blog's MetricsHistogram and StepHistogram did):
utilization values per device over 0–100 %, and step durations per node and rank on shared bins."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np

from stallwatch.analyze.frames import NodeFrame
from stallwatch.analyze.heatmap import row_columns
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.series import Hist
from stallwatch.analyze.step_digest import node_event_slices
from stallwatch.records import STEP
from stallwatch.store.reader import Run


def utilization_histograms(frame: NodeFrame, dimension: str, *, bins: int = 50,
                           keep: Callable[[str], bool] = lambda _name: True) -> list[Hist]:
    """One histogram per device of `dimension` ("CPU", "GPU", "GPU memory", "I/O"; the node-wide total first),
    as the percentage of its samples in each of `bins` bins over 0–100 %; devices `keep` refuses are left out."""
    edges = np.linspace(0.0, 100.0, bins + 1)
    out = []
    for name, values in row_columns(frame, (dimension,), total=True):
        if not keep(name):
            continue
        v = values[~np.isnan(values)]
        if v.size:
            counts, _ = np.histogram(np.clip(v, 0, 100), bins=edges)
            out.append(Hist(name, edges, 100.0 * counts / v.size))
    return out


def step_duration_histograms(run: Run, *, mode: str | None, nodes: Iterable[str], bins: int = 100) -> list[Hist]:
    """Step durations (ms) of `mode` (every mode when None) per node and rank, counted on bins shared by all
    of them so they overlay; empty when none of `nodes` recorded such steps. Read node by node, an hour of a
    node at a time, twice (the shortest and longest step first, for the shared bins, then the counts): it holds
    one slice's steps, never the run's, whatever the run's size."""
    wanted = sorted(set(nodes))
    lo, hi = np.inf, -np.inf
    for _, _, ms in _step_ms(run, wanted, mode):
        lo, hi = min(lo, float(ms.min())), max(hi, float(ms.max()))
    if lo > hi:
        return []
    edges = np.histogram_bin_edges(np.array([lo, hi]), bins=bins)  # what numpy gives all the durations: min, max
    counts: dict[tuple[str, int], np.ndarray] = {}
    for node, rank, ms in _step_ms(run, wanted, mode):
        have = counts.setdefault((node, rank), np.zeros(len(edges) - 1, np.int64))
        have += np.histogram(ms, bins=edges)[0]
    return [Hist(f"{node}/{rank}", edges, c) for (node, rank), c in sorted(counts.items())]


def _step_ms(run: Run, nodes: list[str], mode: str | None) -> Iterator[tuple[str, int, np.ndarray]]:
    """(node, rank, step durations in ms) of each slice of each node, for the steps of `mode` (any when None)."""
    for node in nodes:
        for events in node_event_slices(run, node, [STEP]):
            steps = FrameworkColumns(events)
            mask = steps.mode_is([mode]) if mode is not None else np.ones(steps.n, bool)
            if not mask.any():
                continue
            ms = (steps.end[mask] - steps.start[mask]) / 1000.0
            ranks = steps.rank[mask]
            for rank in np.unique(ranks).tolist():
                yield node, int(rank), ms[ranks == rank]
