"""The heatmap's rows: every core and GPU of a node, bucketed within the cell budget over all nodes."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze import heatmap
from tests.analyze.rules._gen import make_node


def test_cell_budget():
    frames = {f"n{k}": make_node(f"n{k}", 20_000, 24, 8, seed=k, dtype=np.float32) for k in range(3)}
    rows = heatmap.node_heatmaps(frames)
    cells = sum(r.values.size for r in rows.values())
    assert len(rows) == 3 and cells <= heatmap.CELL_BUDGET
    assert heatmap.buckets_for(8 * 200) == heatmap.MIN_BUCKETS and heatmap.buckets_for(10) == heatmap.MAX_BUCKETS


def test_total_rows_and_unknown_dimension():
    frame = make_node("n", 100, 2, 1)
    names = [n for n, _ in heatmap.row_columns(frame, ("CPU", "I/O"), total=True)]
    assert names == ["cpu total", "cpu0", "cpu1", "cpu total I/O wait", "cpu0 I/O wait", "cpu1 I/O wait"]
    with pytest.raises(ValueError, match="unknown heatmap dimension 'Disk'; choose from GPU, CPU"):
        heatmap.row_columns(frame, ("Disk",))
