"""Timeline section: system metrics per node from a generated run (GPUs included), training phases merged from
the step events, the rules' flagged moments at the planted times, and the points kept within budget."""

from __future__ import annotations

import numpy as np
import pytest
from bokeh.models import GlyphRenderer, GridPlot, HBar, Line, Scatter, VStrip

from stallwatch.present.report.context import ReportContext
from stallwatch.present.report.model import Chart, NotApplicable, Paragraph, Table
from stallwatch.present.report.sections import timeline
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import FwGen
from tests.analyze.rules._gen import INTERVAL_US, START_US, make_node, plant_cpu_bottleneck
from tests.present.generated_run import S, training_run, write_run

BOTTLENECK = (300, 1500)  # snapshots of algo-1 where gpu1 idles while cpu3 is saturated (over the patience)


def _ctx(path) -> ReportContext:
    return ReportContext(open_run(str(path)))


def _figures(chart: Chart) -> list:
    """The metric panels (without the flagged track on top)."""
    model = chart.model
    figs = [c[0] for c in model.children] if isinstance(model, GridPlot) else [model]
    return [f for f in figs if f.title.text != "Flagged by the rules"]


def _track(chart: Chart):
    return next(c[0] for c in chart.model.children if c[0].title.text == "Flagged by the rules")


def _lines(fig) -> dict[str, GlyphRenderer]:
    return {r.name: r for r in fig.renderers if isinstance(r, GlyphRenderer) and isinstance(r.glyph, Line)}


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory):
    """Two nodes with 4 GPUs; algo-1 has a CPU bottleneck and a one-snapshot GPU-memory spike; two ranks each
    with slow steps 100 and 2000."""
    a = plant_cpu_bottleneck(make_node("algo-1", 2400, 8, 4, seed=1), *BOTTLENECK, gpu=1, core=3)
    a.columns["gpu2/gpu_mem_util"][2222] = 99.0
    b = make_node("algo-2", 2400, 8, 4, seed=2)
    return training_run(tmp_path_factory.mktemp("tl") / "run", frames=[a, b], ranks=2,
                        slow={100: 2 * S, 2000: 3 * S})


@pytest.fixture(scope="module")
def section(busy_run):
    (sec,) = timeline.build(_ctx(busy_run))
    return sec


def test_panels_per_metric_one_line_per_node(section):
    assert section.id == "timeline" and section.title == "Timeline"
    chart = next(b for b in section.blocks if isinstance(b, Chart))
    figs = _figures(chart)
    assert [f.title.text for f in figs] == [m.title for m in timeline.TIMELINE_METRICS]
    for f in figs:
        assert set(_lines(f)) == {"algo-1", "algo-2"}
    gpu = _lines(figs[1])["algo-1"].data_source.data
    # GPU utilization of algo-1 is the mean of its 4 GPUs: one idles (5 %) during the bottleneck, others ~80 %
    t = START_US + 800 * INTERVAL_US
    during = gpu["y"][np.abs(gpu["x"] - t / 1000) < 60_000]
    assert during.size and np.all(during < 70) and np.all(during > 55)


def test_one_snapshot_spike_survives(section):
    chart = next(b for b in section.blocks if isinstance(b, Chart))
    mem = _lines(_figures(chart)[3])["algo-1"].data_source.data
    # mean of 4 GPUs' memory: 3 at ~40 %, one at 99 % for a single snapshot -> ~55 %
    assert mem["y"].max() > 50
    assert mem["x"][np.argmax(mem["y"])] == (START_US + 2222 * INTERVAL_US) / 1000


def test_phases_shaded_and_merged(section):
    chart = next(b for b in section.blocks if isinstance(b, Chart))
    strips = {r.data_source.data["text"][0].split(" ")[0]: r.data_source.data
              for r in _figures(chart)[0].renderers if isinstance(r.glyph, VStrip)}
    assert {"Initialization:", "Training", "Evaluation", "Finalization:", "CPU"} <= set(strips)
    train = strips["Training"]
    assert len(train["x0"]) == 2  # two training stretches around the evaluation pass, not one strip per step
    assert train["x0"][0] == (START_US + 60 * S) / 1000  # the first step


def test_flagged_moments_at_planted_times(busy_run):
    ctx = _ctx(busy_run)
    spans = timeline.bottleneck_spans(ctx.rules, INTERVAL_US)
    cpu = [s for s in spans if s.label == "CPU bottleneck"]
    assert cpu and "algo-1" in cpu[0].text
    # the rule flags snapshots after its patience (1000); they lie inside the planted range
    assert START_US + BOTTLENECK[0] * INTERVAL_US <= cpu[0].start_us
    assert cpu[-1].end_us <= START_US + (BOTTLENECK[1] + 1) * INTERVAL_US
    markers = timeline.outlier_markers(ctx.rules)
    texts = [m.text for m in markers]
    assert any(t.startswith("TRAIN step 100: 2 s") for t in texts)
    assert any(t.startswith("TRAIN step 2000: 3 s") for t in texts)
    # the same step slow on 4 ranks is one marker naming them
    step100 = next(m for m in markers if "step 100:" in m.text)
    assert "algo-1/0" in step100.text and "algo-2/1" in step100.text


def test_markers_drawn_and_listed(section):
    chart = next(b for b in section.blocks if isinstance(b, Chart))
    track = _track(chart)
    marks = [r for r in track.renderers if isinstance(r.glyph, Scatter)]
    assert marks and any("step 2000" in t for r in marks for t in r.data_source.data["text"])
    bars = [r for r in track.renderers if isinstance(r.glyph, HBar)]
    labels = [r.data_source.data["y"][0] for r in bars]
    windows = {label for _, label in timeline.WINDOW_RULES}
    assert labels[0] == "CPU bottleneck" and set(labels[1:]) <= windows
    table = next(b for b in section.blocks if isinstance(b, Table))
    rows = {row[0]: row for row in table.rows}
    # the GPU window rules' flagged windows (the planted idle GPU): drawn as listed, counted as the rule counts
    assert "Low GPU utilization" in labels and 1 <= rows["Low GPU utilization"][1] <= rows["Low GPU utilization"][2]
    assert rows["Training"][1] == 2 and rows["Evaluation"][1] == 1
    # 2 slow steps on 4 ranks: 8 outliers reported by the rule, drawn as 2 marks
    assert rows["Outlier step"][1:3] == [2, 8]
    assert rows["CPU bottleneck"][1] >= 1 and rows["CPU bottleneck"][2] == rows["CPU bottleneck"][1]


def test_phase_spans_from_events():
    fw = FwGen()
    for rank in (0, 1):
        s, e = fw.steps(rank=rank, n=300, start_us=START_US + 10 * S, step_us=100_000, seed=rank)
        s, e = fw.steps(rank=rank, mode="EVAL", n=50, start_us=int(e[-1]) + 20 * S, step_us=50_000, seed=rank)
        fw.steps(rank=rank, n=300, first_step=300, start_us=int(e[-1]) + 20 * S, step_us=100_000, seed=rank)
    table = fw.table()
    spans = timeline.phase_spans(timeline.step_columns(table), START_US, START_US + 3600 * S)
    labels = [sp.label for sp in spans]
    assert labels == ["Initialization", "Training", "Training", "Evaluation", "Finalization"]
    starts = table["start_us"].to_numpy()
    ends = table["end_us"].to_numpy()
    assert spans[0].end_us == starts.min() and spans[-1].start_us == ends.max()
    assert spans[-1].end_us == START_US + 3600 * S


def test_merge_breaks_only_at_long_gaps():
    starts = np.array([0, 10, 20, 100, 110, 0, 5, 300], dtype=np.int64)  # three "ranks", in time order each
    ends = starts + 8
    assert timeline._merge(starts, ends, 5) == [(0, 28), (100, 118), (300, 308)]
    assert timeline._merge(starts, ends, 100) == [(0, 118), (300, 308)]


def test_points_stay_within_budget(tmp_path):
    frames = [make_node(f"n{k}", 30_000, 2, 2, seed=k) for k in range(4)]
    frames[0].columns["gpu0/gpu_util"][12_345] = 100.0  # mean of 2 GPUs: (100 + ~80) / 2
    frames[0].columns["gpu1/gpu_util"][12_345] = 100.0
    panels = timeline.panels({f.node: f for f in frames})
    lines = [s for p in panels for s in p.series]
    assert len(lines) == 4 * 6
    buckets = timeline.buckets_for(len(lines))
    assert all(len(s.ts) <= 2 * buckets for s in lines)
    assert sum(len(s.ts) for s in lines) <= timeline.POINT_BUDGET
    gpu = next(s for s in panels[1].series if s.name == "n0")
    assert gpu.values.max() == 100.0 and gpu.ts[np.argmax(gpu.values)] == START_US + 12_345 * INTERVAL_US


def test_cpu_only_run_without_framework(tmp_path):
    write_run(tmp_path / "run", [make_node("algo-1", 400, 4, 0)])
    (sec,) = timeline.build(_ctx(tmp_path / "run"))
    chart = next(b for b in sec.blocks if isinstance(b, Chart))
    titles = [f.title.text for f in _figures(chart)]
    assert "GPU utilization (mean of the node's GPUs)" not in titles and "CPU utilization (all cores)" in titles
    text = " ".join(b.text for b in sec.blocks if isinstance(b, Paragraph))
    assert "Not recorded on any node: GPU utilization" in text
    assert "no training steps" in text


def test_no_system_data(tmp_path):
    frame = make_node("algo-1", 10, 2, 0)
    write_run(tmp_path / "run", [frame])
    for path in (tmp_path / "run" / "system").rglob("*"):
        if path.is_file():
            path.unlink()
    (sec,) = timeline.build(_ctx(tmp_path / "run"))
    assert any(isinstance(b, NotApplicable) for b in sec.blocks)
