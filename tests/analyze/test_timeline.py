"""The timeline's analyses: training phases merged from the step events, the rules' flagged moments at the
planted times, and the system lines downsampled within their point budget (peaks kept)."""

from __future__ import annotations

import numpy as np

from stallwatch.analyze import timeline
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.store.reader import open_run
from tests.analyze.rules._fw_gen import FwGen
from tests.analyze.rules._gen import INTERVAL_US, START_US, make_node
from tests.present.generated_run import S
from tests.present.report.sections._timeline_run import BOTTLENECK, busy_run  # noqa: F401 (a fixture)


def test_flagged_moments_at_planted_times(busy_run):
    analysis = RunAnalysis(open_run(str(busy_run)))
    spans = timeline.bottleneck_spans(analysis.rules_by_name, {"algo-1": INTERVAL_US / 1000})
    cpu = [s for s in spans if s.label == "CPU bottleneck"]
    assert cpu and "algo-1" in cpu[0].text
    # the rule flags snapshots after its patience (1000); they lie inside the planted range
    assert START_US + BOTTLENECK[0] * INTERVAL_US <= cpu[0].start_us
    assert cpu[-1].end_us <= START_US + (BOTTLENECK[1] + 1) * INTERVAL_US
    markers = timeline.outlier_markers(analysis.rules_by_name)
    texts = [m.text for m in markers]
    assert any(t.startswith("TRAIN step 100: 2 s") for t in texts)
    assert any(t.startswith("TRAIN step 2000: 3 s") for t in texts)
    # the same step slow on 4 ranks is one marker naming them
    step100 = next(m for m in markers if "step 100:" in m.text)
    assert "algo-1/0" in step100.text and "algo-2/1" in step100.text


def test_phase_spans_from_events():
    fw = FwGen()
    for rank in (0, 1):
        s, e = fw.steps(rank=rank, n=300, start_us=START_US + 10 * S, step_us=100_000, seed=rank)
        s, e = fw.steps(rank=rank, mode="EVAL", n=50, start_us=int(e[-1]) + 20 * S, step_us=50_000, seed=rank)
        fw.steps(rank=rank, n=300, first_step=300, start_us=int(e[-1]) + 20 * S, step_us=100_000, seed=rank)
    table = fw.table()
    spans = timeline.phase_spans(FrameworkColumns(table), START_US, START_US + 3600 * S)
    labels = [sp.label for sp in spans]
    assert labels == ["Initialization", "Training", "Training", "Evaluation", "Finalization"]
    starts = table["start_us"].to_numpy()
    ends = table["end_us"].to_numpy()
    assert spans[0].end_us == starts.min() and spans[-1].start_us == ends.max()
    assert spans[-1].end_us == START_US + 3600 * S


def test_merge_breaks_only_at_long_gaps():
    starts = np.array([0, 10, 20, 100, 110, 0, 5, 300], dtype=np.int64)  # three "ranks", in time order each
    ends = starts + 8
    assert timeline.merge_intervals(starts, ends, 5) == [(0, 28), (100, 118), (300, 308)]
    assert timeline.merge_intervals(starts, ends, 100) == [(0, 118), (300, 308)]


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


def test_long_lines_are_cut_in_two_stages_keeping_span_and_peaks():
    """A line longer than 2 × MAX_BUCKETS points is first cut to MAX_BUCKETS buckets as its node is read (so a
    fleet's nodes are never in memory at once), then to the panel's buckets: the span, the peaks and the troughs
    stay, every point is a real sample; a short line is cut once, as before."""
    frame = make_node("n0", 30_000, 2, 2, seed=3)
    values = frame.columns["cpu/cpu_util"].astype(np.float64)
    values[7_777], values[20_001] = 123.0, -5.0
    ts, cut = timeline.prepare_line(frame.timestamps, values)
    assert len(ts) <= 2 * timeline.MAX_BUCKETS + 2 and (ts[0], ts[-1]) == (frame.timestamps[0], frame.timestamps[-1])
    final_ts, final = timeline.minmax(ts, cut, 400)
    assert final.max() == 123.0 and final.min() == -5.0
    assert np.array_equal(values[np.searchsorted(frame.timestamps, final_ts)], final)
    short = make_node("n1", 1_000, 2, 2, seed=4)
    line = (short.timestamps, short.columns["cpu/cpu_util"])
    assert all(np.array_equal(a, b) for a, b in zip(timeline.prepare_line(*line), line))


def test_panels_from_frames_made_one_at_a_time_equal_panels_from_all():
    frames = [make_node(f"n{k}", 5_000, 2, 2, seed=k) for k in range(3)]
    together = timeline.panels({f.node: f for f in frames})
    one_by_one = timeline.panels((f.node, f) for f in frames)
    assert [(p.title, [(s.name, s.ts.tolist(), s.values.tolist()) for s in p.series]) for p in together] == \
        [(p.title, [(s.name, s.ts.tolist(), s.values.tolist()) for s in p.series]) for p in one_by_one]
