"""The report's per-step views read node by node, an hour (here: 37 s) at a time, equal the whole-run functions
on every step at once: the step histograms, the rank × step matrices, the training stretches and the cost of
detailed-profiling windows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from stallwatch.analyze import step_digest, timeline
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.cost import window_costs
from stallwatch.analyze.ranks import rank_steps
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.steps import step_histograms
from stallwatch.records import EVAL, STEP, TRAIN
from tests.analyze.rules._fw_gen import T0, FwGen
from tests.present.generated_run import training_run

SLOW = {k: 2_000_000 for k in range(300, 1500, 300)}


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    run = training_run(tmp_path_factory.mktemp("digest") / "run", nodes=("algo-1", "algo-2", "algo-3"), ranks=2,
                       slow=SLOW)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_digest, "NODE_SLICE_US", 37_000_000)  # slice edges inside steps and stretches
        a = RunAnalysis(str(run))
        yield a, {"hist": a.step_histograms({TRAIN, EVAL}), "train": a.step_histograms({TRAIN}),
                  "ranks": a.rank_steps(), "eval_ranks": a.rank_steps(EVAL), "spans": a.phase_spans}


def test_histograms_node_by_node_equal_the_whole_run(analysis):
    a, got = analysis
    for modes, key in (({TRAIN, EVAL}, "hist"), ({TRAIN}, "train")):
        whole = step_histograms(a.steps, modes)
        assert [h.node for h in got[key]] == [h.node for h in whole] == ["algo-1", "algo-2", "algo-3"]
        for mine, theirs in zip(got[key], whole):
            assert np.array_equal(mine.edges, theirs.edges)
            assert mine.shares.keys() == theirs.shares.keys()
            assert all(np.array_equal(mine.shares[k], theirs.shares[k]) for k in mine.shares)
    assert len(got["hist"][0].shares) == 4 and len(got["train"][0].shares) == 2  # (rank, mode) series


def test_rank_matrices_node_by_node_equal_the_whole_run(analysis):
    a, got = analysis
    for mode, key in ((TRAIN, "ranks"), (EVAL, "eval_ranks")):
        whole = rank_steps(a.steps, a.data_waits, mode=mode)
        mine = got[key]
        assert mine.ranks == whole.ranks == [f"algo-{n}/{r}" for n in (1, 2, 3) for r in (0, 1)]
        assert (mine.first_step, mine.steps_per_column, mine.ranks_total) == \
            (whole.first_step, whole.steps_per_column, whole.ranks_total)
        assert np.array_equal(mine.step_ms, whole.step_ms, equal_nan=True)
        assert np.array_equal(mine.wait_pct, whole.wait_pct, equal_nan=True)
    slow_col = 300 // got["ranks"].steps_per_column
    assert np.all(got["ranks"].step_ms[:, slow_col] > np.nanmedian(got["ranks"].step_ms) * 2)  # planted, every rank


def test_training_stretches_node_by_node_equal_the_whole_run(analysis):
    a, got = analysis
    gaps = {mode: timeline.phase_gap_us(1000.0 * ms) for mode, ms in a._median_step_ms.items() if mode}
    whole = timeline.phase_spans(a.steps, a.info.get("start_us"), a.info.get("end_us"), gaps_us=gaps)
    assert got["spans"] == whole
    labels = [s.label for s in whole]
    assert labels.count("Training") == 2 and labels.count("Evaluation") == 1 and labels[0] == "Initialization"


def test_typical_step_is_the_weighted_median_of_the_ranks_medians(analysis):
    a, _ = analysis
    assert a._median_step_ms[TRAIN] == pytest.approx(100.0, abs=2.0)
    assert a._median_step_ms[EVAL] == pytest.approx(50.0, abs=2.0)
    assert a._median_step_ms[""] == pytest.approx(100.0, abs=2.0)  # 6,000 training steps to 400 evaluation ones


def test_window_costs_sliced_equal_the_whole_table():
    """Two windows on one rank, one on another rank, one on a rank of another node (not this node's plan):
    each window's cost from the node's steps fed in 37-second slices equals `window_costs` on all of them."""
    gen = FwGen()
    for rank in (0, 1):
        gen.steps(node="algo-1", rank=rank, n=2000, seed=rank, slow={k: 150_000 for k in range(500, 600)})
    table = gen.table()
    steps = FrameworkColumns(table.filter(pc.equal(table["kind"].cast(pa.string()), STEP)))
    at = lambda k: int(T0 + k * 101_000)  # noqa: E731  (about step k's start)
    windows = [{"node": "algo-1", "rank": 0, "mode": TRAIN, "start_us": at(500), "end_us": at(600), "window": "a"},
               {"node": "algo-2", "rank": 0, "mode": TRAIN, "start_us": at(100), "end_us": at(200), "window": "b"},
               {"node": "algo-1", "rank": 0, "mode": TRAIN, "start_us": at(1000), "end_us": at(1010), "window": "c"},
               {"node": "algo-1", "rank": 1, "mode": TRAIN, "start_us": at(700), "end_us": at(900), "window": "d"}]
    mine = [(i, w) for i, w in enumerate(windows) if w["node"] == "algo-1"]
    acc = step_digest.StepDigestAccumulator("algo-1", step_digest.DigestPlan(windows=mine))
    lo, hi = pc.min(table["start_us"]).as_py(), pc.max(table["start_us"]).as_py()
    for a in range(lo, hi + 1, 37_000_000):
        part = pc.and_(pc.greater_equal(table["start_us"], a), pc.less(table["start_us"], a + 37_000_000))
        acc.add(table.filter(part))
    got = acc.result().windows
    whole = window_costs(steps, [w for _, w in mine])
    assert [c for _, c in got] == whole and [i for i, _ in got] == [0, 2, 3]
    assert whole[0].median_inside_ms > 140 and whole[0].median_outside_ms < 110


def test_a_report_holds_few_nodes_snapshots_and_draws_the_same(tmp_path, monkeypatch):
    """Nodes' snapshots are cached up to SYSTEM_CACHE_BYTES (least recently used dropped): with room for one
    node, the timeline panels and heatmaps read node after node and equal those drawn with every node in memory."""
    from stallwatch.analyze import analysis as analysis_mod

    run = str(training_run(tmp_path / "run", nodes=("algo-1", "algo-2", "algo-3"), with_framework=False))
    roomy = RunAnalysis(run)
    panels, heat = roomy.timeline_panels(), roomy.heatmaps()
    assert len(roomy._system) == 3
    monkeypatch.setattr(analysis_mod, "SYSTEM_CACHE_BYTES", 1)
    tight = RunAnalysis(run)
    drawn = lambda ps: [(p.title, [(s.name, s.ts.tolist(), s.values.tolist()) for s in p.series]) for p in ps]  # noqa: E731
    assert drawn(tight.timeline_panels()) == drawn(panels)
    assert len(tight._system) == 1
    again = tight.heatmaps()
    assert again.keys() == heat.keys() == {"algo-1", "algo-2", "algo-3"}
    assert all(np.array_equal(again[n].values, heat[n].values, equal_nan=True) and again[n].names == heat[n].names
               for n in heat)
    assert len(tight._system) == 1


def test_the_report_reads_each_node_once_for_its_step_views(analysis):
    """The histograms of every mode, the TRAIN rank × step matrix and the training stretches come from one read
    of each node (one task per node); what they hold is checked against the whole-run functions above."""
    first, got = analysis
    a = RunAnalysis(str(first.run.uri))
    a.step_stats()
    tasks = a.engine.stats.tasks
    spans, hist, ranks = a.phase_spans, a.step_histograms({TRAIN, EVAL}), a.rank_steps()
    assert a.engine.stats.tasks - tasks == 3  # three nodes, one task each
    assert spans == got["spans"]
    assert [(h.node, h.edges.tolist(), {k: v.tolist() for k, v in h.shares.items()}) for h in hist] == \
        [(h.node, h.edges.tolist(), {k: v.tolist() for k, v in h.shares.items()}) for h in got["hist"]]
    assert np.array_equal(ranks.step_ms, got["ranks"].step_ms, equal_nan=True)
