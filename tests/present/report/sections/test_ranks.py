"""Ranks step by step: one heatmap row per rank, step numbers on x, the step-time map and the data-wait map;
the straggler finding's ranks are marked; a run without steps says so."""

from __future__ import annotations

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult
from stallwatch.present.report.model import Chart, NotApplicable, Paragraph
from stallwatch.present.report.sections import ranks

from ._runs import N_STEPS, built


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return built("gpu", tmp_path_factory)


def test_two_maps_one_row_per_rank(gpu):
    (sec,) = ranks.build(gpu)
    assert (sec.id, sec.title) == ("ranks", "Ranks step by step")
    step_map, wait_map = [b for b in sec.blocks if isinstance(b, Chart)]
    assert step_map.model.kind == "step_heatmap"
    image = step_map.model.values
    assert image.shape[0] == 2  # algo-2's ranks 0 and 1
    per_column = -(-N_STEPS // 600)  # 1,500 steps in at most 600 columns: 3 steps each
    assert image.shape[1] == (N_STEPS - 1) // per_column + 1
    assert "data" in wait_map.model.title
    assert sorted(step_map.model.rows) == ["algo-2/0", "algo-2/1"]
    straggler = gpu.rule("Straggler")
    fired = {f"{x['node']}/{x['rank']}" for x in straggler.details.get("stragglers", [])} if straggler else set()
    assert set(step_map.model.highlight) == fired  # drawn with ▶ before the name


def test_the_straggler_is_marked(gpu):
    straggler = RuleResult("Straggler", 1, 1, 100, {}, "", "Look at algo-2/1.",
                           {"stragglers": [{"node": "algo-2", "rank": 1, "excess_s_per_step": 0.02}]})
    marked = RunAnalysis(gpu.run, rule_results=[*gpu.rule_results, straggler])
    (sec,) = ranks.build(marked)
    assert any(isinstance(b, Paragraph) and "algo-2/1 (marked ▶)" in b.text for b in sec.blocks)
    chart = next(b for b in sec.blocks if isinstance(b, Chart))
    assert "algo-2/1" in chart.model.highlight


def test_without_steps_it_says_so(tmp_path_factory):
    (sec,) = ranks.build(built("cpu_only", tmp_path_factory))
    assert isinstance(sec.blocks[0], NotApplicable)
