"""Utilization heatmap: per node every GPU then every core a row, the planted CPU bottleneck visible as an idle
GPU row next to a saturated core row, gaps as cells without colour, and the size kept within the cell budget."""

from __future__ import annotations

import numpy as np

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present import charts
from stallwatch.present.report.model import Chart, NotApplicable, Paragraph
from stallwatch.present.report.sections import heatmap
from stallwatch.store.reader import open_run
from tests.analyze.rules._gen import INTERVAL_US, START_US, make_node, plant_cpu_bottleneck
from tests.present.generated_run import write_run


def _images(chart: Chart) -> list[charts.HeatmapSpec]:
    return list(chart.model.children) if isinstance(chart.model, charts.GridSpec) else [chart.model]


def test_rows_and_planted_bottleneck(tmp_path):
    a = plant_cpu_bottleneck(make_node("algo-1", 3000, 6, 3, seed=1), 1000, 1600, gpu=2, core=4)
    a.columns["gpu0/gpu_util"][2000:2300] = np.nan  # the GPU fell off the bus for a while
    write_run(tmp_path / "run", [a, make_node("algo-2", 3000, 6, 3, seed=2)])
    (sec,) = heatmap.build(RunAnalysis(open_run(str(tmp_path / "run"))))
    assert sec.id == "heatmap" and sec.title == "Utilization heatmap"
    chart = next(b for b in sec.blocks if isinstance(b, Chart))
    shown = _images(chart)
    assert [f.title.split(":")[0] for f in shown] == ["algo-1", "algo-2"]
    assert isinstance(chart.model, charts.GridSpec) and chart.model.share_x  # one time axis for both
    image = shown[0]
    assert image.rows == ["gpu0", "gpu1", "gpu2"] + [f"cpu{i}" for i in range(6)]
    cells = np.asarray(image.to_json()["values"], dtype=np.float64)  # as carried: null (a gap) -> NaN
    assert cells.shape[0] == 9
    col = lambda i: int(((START_US + i * INTERVAL_US) / 1000 - image.x0) // image.dx)
    inside = slice(col(1050), col(1550))
    assert np.allclose(cells[2, inside], 5, atol=0.01)      # gpu2 idle
    assert np.allclose(cells[3 + 4, inside], 95, atol=0.01)  # cpu4 saturated
    assert np.all(cells[1, inside] >= 70)     # gpu1 busy as usual
    assert np.all(np.isnan(cells[0, col(2020):col(2280)]))  # a gap: no snapshot, no colour
    assert not np.isnan(cells[1:, :]).any()  # every other cell had a snapshot and is coloured


def test_cpu_only_node_and_note(tmp_path):
    write_run(tmp_path / "run", [make_node("algo-1", 500, 4, 0), make_node("algo-2", 500, 4, 2)])
    (sec,) = heatmap.build(RunAnalysis(open_run(str(tmp_path / "run"))))
    notes = " ".join(b.text for b in sec.blocks if isinstance(b, Paragraph))
    assert "No GPU recorded on algo-1" in notes
    image, _ = _images(next(b for b in sec.blocks if isinstance(b, Chart)))
    assert np.asarray(image.values).shape[0] == 4


def test_no_rows_is_not_applicable(tmp_path):
    frame = make_node("algo-1", 100, 0, 0)
    write_run(tmp_path / "run", [frame])
    (sec,) = heatmap.build(RunAnalysis(open_run(str(tmp_path / "run"))))
    assert any(isinstance(b, NotApplicable) for b in sec.blocks)


def test_a_fleet_draws_the_nodes_that_matter_first_and_says_so(tmp_path, monkeypatch):
    """Past MAX_DRAWN_NODES, the heatmap draws the nodes the findings name first (here the node with the planted
    CPU bottleneck, last by name), then by name, and says how many of how many it draws."""
    from stallwatch.analyze import analysis as analysis_mod

    nodes = [make_node(f"algo-{k}", 2000, 4, 2, seed=k) for k in range(1, 5)]
    nodes.append(plant_cpu_bottleneck(make_node("algo-9", 2000, 4, 2, seed=9), 500, 1500, gpu=1, core=2))
    write_run(tmp_path / "run", nodes)
    monkeypatch.setattr(analysis_mod, "MAX_DRAWN_NODES", 3)
    analysis = RunAnalysis(open_run(str(tmp_path / "run")))
    assert "algo-9" in {n for f in analysis.findings.findings for n in f.where.nodes}
    assert analysis.drawn_nodes() == ["algo-9", "algo-1", "algo-2"]
    (sec,) = heatmap.build(analysis)
    shown = _images(next(b for b in sec.blocks if isinstance(b, Chart)))
    assert [f.title.split(":")[0] for f in shown] == ["algo-9", "algo-1", "algo-2"]
    assert any(isinstance(b, Paragraph) and b.text.startswith("3 of the 5 nodes are drawn") for b in sec.blocks)
