"""Notebook views built from generated runs (a path, a Path or a Run), their chart specs and numbers, and a real
notebook executed by a Jupyter kernel (nbclient + ipykernel) rendering them inline (the report's draw.js)."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.notebook import Heatmap, MetricsHistogram, StepHistogram, Timeline
from stallwatch.present import charts
from stallwatch.store.reader import open_run
from tests.analyze.rules._gen import make_node, plant_cpu_bottleneck
from tests.present.generated_run import S, training_run, write_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    a = plant_cpu_bottleneck(make_node("algo-1", 2400, 4, 2, seed=1), 300, 1500, gpu=1, core=2)
    b = make_node("algo-2", 2400, 4, 2, seed=2)
    return training_run(tmp_path_factory.mktemp("nb") / "run", frames=[a, b], ranks=2, slow={100: 2 * S})


def _specs(model, kind):
    """The specs of `kind` a view draws (a grid's children)."""
    specs = model.children if isinstance(model, charts.GridSpec) else [model]
    return [s for s in specs if isinstance(s, kind)]


def test_metrics_histogram_shares_sum_to_100(run_dir):
    view = MetricsHistogram(str(run_dir), select_dimensions=["CPU", "GPU"])
    assert isinstance(view.figure, charts.ChartSpec)
    assert set(view.histograms) == {("algo-1", "CPU"), ("algo-1", "GPU"), ("algo-2", "CPU"), ("algo-2", "GPU")}
    cpu = view.histograms[("algo-1", "CPU")]
    assert [h.name for h in cpu] == ["cpu total", "cpu0", "cpu1", "cpu2", "cpu3"]
    for h in cpu:
        assert h.counts.sum() == pytest.approx(100.0) and h.edges[0] == 0 and h.edges[-1] == 100
    # cpu2 was saturated (95 %) for 1200 of 2400 snapshots: half its samples in the 94-96 % bin
    cpu2 = next(h for h in cpu if h.name == "cpu2")
    assert cpu2.counts[np.searchsorted(cpu2.edges, 95.0, side="right") - 1] == pytest.approx(50.0)
    assert sum(len(h.series) for h in _specs(view.figure, charts.HistogramSpec)) == 2 * (5 + 2)


def test_metrics_histogram_select_events(run_dir):
    view = MetricsHistogram(run_dir, select_dimensions=["CPU", "GPU"], select_events=["total", "gpu1"],
                            nodes=["algo-2"])
    assert {k: [h.name for h in v] for k, v in view.histograms.items()} == {
        ("algo-2", "CPU"): ["cpu total"], ("algo-2", "GPU"): ["gpu1"]}
    with pytest.raises(ValueError, match="nothing to show"):
        MetricsHistogram(run_dir, select_events=["tpu.*"])
    with pytest.raises(ValueError, match="unknown node"):
        MetricsHistogram(run_dir, nodes=["algo-9"])


def test_step_histogram_counts_every_step(run_dir):
    view = StepHistogram(open_run(str(run_dir)))
    assert [h.name for h in view.histograms] == ["algo-1/0", "algo-1/1", "algo-2/0", "algo-2/1"]
    assert all(h.counts.sum() == 3000 for h in view.histograms)  # two training loops of 1500 steps per rank
    slow_bin = view.histograms[0].counts[-1]
    assert slow_bin == 1 and view.histograms[0].edges[-1] == pytest.approx(2000.0)  # step 100: 2 s
    evals = StepHistogram(run_dir, mode="EVAL", nodes=["algo-2"])
    assert [h.counts.sum() for h in evals.histograms] == [200, 200]


def test_step_histogram_needs_steps(tmp_path):
    write_run(tmp_path / "run", [make_node("algo-1", 100, 2, 0)])
    with pytest.raises(ValueError, match="no TRAIN steps"):
        StepHistogram(tmp_path / "run")


def test_heatmap_rows_and_selection(run_dir):
    view = Heatmap(run_dir)
    assert set(view.rows) == {"algo-1", "algo-2"}
    assert view.rows["algo-1"].names == ["gpu0", "gpu1", "cpu0", "cpu1", "cpu2", "cpu3"]
    assert len(_specs(view.figure, charts.HeatmapSpec)) == 2
    picked = Heatmap(run_dir, select_dimensions=["CPU", "GPU", "I/O"], select_events=["total", "gpu1"],
                     nodes=["algo-1"], plot_height=450)
    assert picked.rows["algo-1"].names == ["cpu total", "gpu1", "cpu total I/O wait"]  # in the order asked
    assert picked.figure.height == 450


def test_timeline_view(run_dir):
    view = Timeline(run_dir)
    assert [p.title for p in view.panels][:2] == ["CPU utilization (all cores)",
                                                  "GPU utilization (mean of the node's GPUs)"]
    assert {s.label for s in view.spans} >= {"Initialization", "Training", "Evaluation"}
    assert any(m.label == "Outlier step" for m in view.markers)
    assert any(f.label == "CPU bottleneck" for f in view.flags)
    bare = Timeline(run_dir, nodes=["algo-2"], phases=False, flags=False)
    assert bare.spans == [] and bare.markers == [] and all(len(p.series) == 1 for p in bare.panels)


NOTEBOOK_CELLS = [
    "from stallwatch.notebook import Heatmap, MetricsHistogram, StepHistogram, Timeline\nRUN = {run!r}",
    "MetricsHistogram(RUN, select_dimensions=['GPU'])",
    "StepHistogram(RUN)",
    "Heatmap(RUN, select_dimensions=['CPU', 'GPU'], plot_height=300)",
    "Timeline(RUN)",
]


def test_views_render_inline_in_a_jupyter_kernel(run_dir):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.format(run=str(run_dir))) for c in NOTEBOOK_CELLS]
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3").execute()
    outputs = [c.outputs for c in nb.cells]
    assert all(o.output_type != "error" for cell in outputs for o in cell)
    # each view is one self-contained page (BokehJS, draw.js and its spec inline: no network) in an iframe
    for cell in outputs[1:]:
        shown = [o for o in cell if o.output_type == "execute_result" and "text/html" in o.data]
        assert len(shown) == 1
        page = shown[0].data["text/html"]
        assert page.startswith("<iframe") and "Draw.render" in page and "stallwatch-charts" in page


def test_step_histogram_reads_one_node_and_one_slice_at_a_time(run_dir, monkeypatch):
    """Bounded at any run size: the steps are read a node and a slice of time at a time (twice: the shared bins'
    range, then the counts), never the run's every step at once; the histograms are the same as in one slice."""
    from stallwatch.analyze import step_digest
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.store.reader import Run

    whole = StepHistogram(run_dir).histograms
    monkeypatch.setattr(step_digest, "NODE_SLICE_US", 5_000_000)
    calls = []
    real = Run.framework

    def spy(self, start_us=None, end_us=None, **kw):
        calls.append((start_us, end_us, kw.get("nodes")))
        return real(self, start_us, end_us, **kw)

    monkeypatch.setattr(Run, "framework", spy)
    monkeypatch.setattr(RunAnalysis, "steps", property(lambda self: pytest.fail("every step of the run was read")))
    sliced = StepHistogram(run_dir).histograms
    assert [h.name for h in sliced] == [h.name for h in whole]
    for a, b in zip(sliced, whole):
        assert np.array_equal(a.edges, b.edges) and np.array_equal(a.counts, b.counts), a.name
    assert len(calls) > 8 and all(len(nodes) == 1 and 0 < end - start <= 5_000_000 for start, end, nodes in calls)
