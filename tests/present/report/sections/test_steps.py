"""Step duration analysis on generated runs: the statistics are those of the stored steps, the planted slow
steps (0.4 s, 0.3 s of it waiting for data) appear as outliers in the histogram and in the framework context,
a steady run gets a good verdict, and a run without framework data says how to get it."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from stallwatch.present.report.model import GOOD, WARN, Chart, NotApplicable, Table, Verdict
from stallwatch.present.report.sections import steps

from ._runs import N_STEPS, SLOW_STEPS, SLOW_US, SLOW_WAIT_US, blocks_of, built, glyph_sources, rows_by, table


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return built("gpu", tmp_path_factory)


def _durations(ctx, node: str, rank: int, mode: str) -> np.ndarray:
    fw = ctx.run.framework()
    keep = pc.and_(pc.and_(pc.equal(fw["node"].cast("string"), node), pc.equal(fw["rank"], rank)),
                   pc.and_(pc.equal(fw["kind"].cast("string"), "step"), pc.equal(fw["mode"].cast("string"), mode)))
    rows = fw.filter(keep)
    return (rows["end_us"].to_numpy() - rows["start_us"].to_numpy()) / 1e6


def test_the_stats_table_holds_each_rank_and_phase_of_the_stored_steps(gpu):
    sections = steps.build(gpu)
    assert [(s.title, s.level) for s in sections] == [("Step duration analysis", 3)]
    rows = rows_by(table(sections, "Step durations per node"), "Node", "Rank", "Phase")
    assert set(rows) == {("algo-2", r, m) for r in (0, 1) for m in ("TRAIN", "EVAL")}
    for (node, rank, mode), row in rows.items():
        d = _durations(gpu, node, rank, mode)
        assert row["Steps"] == len(d)
        ms = d * 1000  # the table shows milliseconds
        assert row["Mean [ms]"] == pytest.approx(ms.mean())
        assert row["Max [ms]"] == pytest.approx(ms.max()) and row["Min [ms]"] == pytest.approx(ms.min())
        assert [row["p99 [ms]"], row["p95 [ms]"], row["p50 [ms]"]] == pytest.approx(np.percentile(ms, [99, 95, 50]))
    slow = rows[("algo-2", 0, "TRAIN")]
    assert slow["Steps"] == N_STEPS and slow["Outliers"] == len(SLOW_STEPS) and slow["Fired"] == "yes"
    assert slow["Max [ms]"] == pytest.approx(SLOW_US / 1e3)
    assert rows[("algo-2", 1, "TRAIN")]["Outliers"] == 0


def test_the_histogram_bins_every_stored_step_and_marks_the_planted_outliers(gpu):
    (chart,) = [c for c in blocks_of(steps.build(gpu), Chart) if c.caption == "Step durations on node algo-2"]
    bars = {b.data["series"][0]: b for b in glyph_sources(chart.model, "Quad")}
    assert set(bars) == {"rank 0 TRAIN", "rank 0 EVAL", "rank 1 TRAIN", "rank 1 EVAL"}
    for label, src in bars.items():
        _, rank, mode = label.split()
        d = _durations(gpu, "algo-2", int(rank), mode)
        left, right, top = (np.asarray(src.data[k]) for k in ("left", "right", "top"))
        inside = [np.count_nonzero((d >= a) & ((d < b) | (b == right.max()))) for a, b in zip(left, right)]
        assert list(top) == pytest.approx(np.asarray(inside) / len(d)), label
        assert top.sum() == pytest.approx(1.0)  # every step in one shown bin
    slow = bars["rank 0 TRAIN"]
    assert slow.data["top"][-1] == pytest.approx(len(SLOW_STEPS) / N_STEPS)  # the slow steps: the longest bin
    (ticks,) = glyph_sources(chart.model, "Scatter")
    assert sorted(ticks.data["name"]) == sorted(f"step {n}" for n in SLOW_STEPS)
    assert set(ticks.data["x"]) == {SLOW_US / 1e6}


def test_the_outlier_context_shows_the_slow_steps_waiting_for_data(gpu):
    sections = steps.build(gpu)
    ctx_rows = rows_by(table(sections, "Mean time per step in each phase"), "Rank", "Where the time went")
    wait = ctx_rows[(0, "waiting for data")]
    assert wait["Outlier steps [ms]"] == pytest.approx(SLOW_WAIT_US / 1e3)
    assert wait["Normal steps [ms]"] == pytest.approx(5.0)
    assert wait["Difference [ms]"] == max(r["Difference [ms]"] for r in ctx_rows.values())
    slowest = table(sections, "The 10 slowest outlier steps")
    assert len(slowest.rows) == 10 and {r[3] for r in slowest.rows} <= set(SLOW_STEPS)
    assert all(r[4] == pytest.approx(SLOW_US / 1e3) for r in slowest.rows)
    verdict = blocks_of(sections, Verdict)[-1]
    assert verdict.level == WARN and "algo-2/0/TRAIN" in verdict.text and "waiting for data" in verdict.text


def test_steady_steps_get_a_good_verdict_and_no_outlier_context(tmp_path_factory):
    sections = steps.build(built("slow_start", tmp_path_factory))
    captions = [t.caption for t in blocks_of(sections, Table)]
    assert captions == ["Step durations per node, rank and phase"]  # no outlier context, no slowest steps
    verdict = sections[0].blocks[-1]
    assert isinstance(verdict, Verdict) and verdict.level == GOOD and "No outlier steps" in verdict.text


def test_without_framework_data_it_does_not_apply_and_says_how_to_record(tmp_path_factory):
    sections = steps.build(built("cpu_only", tmp_path_factory))
    (na,) = sections[0].blocks
    assert isinstance(na, NotApplicable)
    assert na.reason.startswith("No framework data on this run") and "stallwatch run" in na.reason


def test_a_fleet_draws_at_most_max_drawn_nodes_histograms_and_says_so(tmp_path, monkeypatch):
    from stallwatch.analyze import analysis as analysis_mod
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present.report.model import Paragraph
    from tests.present.generated_run import training_run

    run = training_run(tmp_path / "run", nodes=("algo-1", "algo-2", "algo-3", "algo-4"), with_framework=True)
    monkeypatch.setattr(analysis_mod, "MAX_DRAWN_NODES", 2)
    sections = steps.build(RunAnalysis(str(run)))
    captions = [c.caption for c in blocks_of(sections, Chart) if c.caption.startswith("Step durations on node")]
    assert captions == ["Step durations on node algo-1", "Step durations on node algo-2"]
    assert any("Histograms of 2 of the 4 nodes are drawn" in b.text for b in blocks_of(sections, Paragraph))
    rows = rows_by(table(sections, "Step durations per node"), "Node", "Rank", "Phase")
    assert {node for node, _, _ in rows} == {"algo-1", "algo-2", "algo-3", "algo-4"}  # the table keeps every node


def test_one_slice_is_a_sentence_not_a_pie(gpu):
    """The outliers' time all in one phase and one part read as two pies of one slice ("100 % optimizer")."""
    from dataclasses import replace

    from stallwatch.analyze.analysis import RunAnalysis

    fired = gpu.rule("StepOutlier")
    assert fired.triggered
    both = RunAnalysis(gpu.run, rule_results=[fired])
    assert any(isinstance(b, Chart) and b.caption == "Where the outlier steps spent their time"
               for b in steps.build(both)[0].blocks)
    one = replace(fired, details={**fired.details, "phase": {"TRAIN": 100.0}, "forward_backward": {"optimizer": 100.0}})
    blocks = steps.build(RunAnalysis(gpu.run, rule_results=[one]))[0].blocks
    assert not any(isinstance(b, Chart) and b.caption == "Where the outlier steps spent their time" for b in blocks)
    assert any(getattr(b, "text", "") == "Over the outlier steps of the series that fired, 100 % of their time went "
               "to optimizer step, all of it in TRAIN steps." for b in blocks)


def test_steps_excused_by_their_intra_op_threads_wait_for_a_cpu_are_said_not_counted():
    from stallwatch.analyze.rules.step_outlier import StepSeries

    said = steps._excused({"a/0/TRAIN": StepSeries(node="a", rank=0, phase="TRAIN", outliers_waiting_for_cpu=3),
                           "a/1/TRAIN": StepSeries(node="a", rank=1, phase="TRAIN", outliers_waiting_for_cpu=1)})
    assert said.startswith(" 4 more steps were above the threshold only by the time the job's intra-op threads")
    assert steps._excused({"a/0/TRAIN": StepSeries(node="a", rank=0, phase="TRAIN")}) == ""
