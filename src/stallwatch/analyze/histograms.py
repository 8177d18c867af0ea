"""Histograms the notebook views draw (as the deep-profiling blog's MetricsHistogram and StepHistogram did):
utilization values per device over 0–100 %, and step durations per node and rank on shared bins."""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from stallwatch.analyze.frames import NodeFrame
from stallwatch.analyze.heatmap import row_columns
from stallwatch.analyze.rules.steps import FrameworkColumns
from stallwatch.analyze.series import Hist


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


def step_duration_histograms(steps: FrameworkColumns, *, mode: str | None, nodes: Iterable[str],
                             bins: int = 100) -> list[Hist]:
    """Step durations (ms) of `mode` (every mode when None) per node and rank, counted on bins shared by all
    of them so they overlay; empty when none of `nodes` recorded such steps."""
    wanted = [n for n in nodes if n in steps.nodes]
    mask = steps.mode_is([mode]) if mode is not None else np.ones(steps.n, bool)
    mask &= np.isin(steps.node, [steps.nodes.index(n) for n in wanted])
    if not mask.any():
        return []
    ms = (steps.end[mask] - steps.start[mask]) / 1000.0
    node_of, rank_of = steps.node[mask], steps.rank[mask]
    edges = np.histogram_bin_edges(ms, bins=bins)
    out = []
    for node in sorted(wanted):
        at_node = node_of == steps.nodes.index(node)
        for rank in np.unique(rank_of[at_node]).tolist():
            out.append(Hist(f"{node}/{rank}", edges, np.histogram(ms[at_node & (rank_of == rank)], bins=edges)[0]))
    return out
