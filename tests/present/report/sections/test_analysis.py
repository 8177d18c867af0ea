"""Section 5's heading: the training loop's share of the job from the run's own steps, "Analyzing
initialization" first when the planted 25-minute start outlasts the loop, a plain statement without steps;
and every chart of every section-5 subsection is a Bokeh model that serializes, small."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from stallwatch.present.report.model import WARN, Chart, NotApplicable, Paragraph, Table, Verdict
from stallwatch.present.report.sections import (
    analysis,
    batch_size,
    cpu_bottlenecks,
    dataloading,
    gpu_memory,
    gpu_utilization,
    io_bottlenecks,
    load_balancing,
    steps,
)
from stallwatch.present.report.sections._loop import HOW_TO_RECORD, duration

from . import _runs
from ._runs import INIT_MINUTES, blocks_of, built

SUBSECTIONS = (steps, gpu_utilization, load_balancing, dataloading, batch_size, cpu_bottlenecks, io_bottlenecks,
               gpu_memory)


@pytest.fixture(scope="module", params=["gpu", "cpu_only", "slow_start"])
def any_run(request, tmp_path_factory):
    return built(request.param, tmp_path_factory)


def _loop_bounds(ctx) -> tuple[int, int]:
    fw = ctx.run.framework()
    steps_ = fw.filter(pc.equal(fw["kind"].cast("string"), "step"))
    return pc.min(steps_["start_us"]).as_py(), pc.max(steps_["end_us"]).as_py()


def test_the_training_loop_gets_its_duration_and_share_of_the_job(tmp_path_factory):
    ctx = built("gpu", tmp_path_factory)
    sections = analysis.build(ctx)
    assert [(s.id, s.title, s.level) for s in sections] == [("training-loop", "Analyzing the training loop", 2)]
    first, last = _loop_bounds(ctx)
    job = ctx.info["end_us"] - ctx.info["start_us"]
    text = sections[0].blocks[0].text
    assert f"lasted {duration((last - first) / 1e6)}" in text
    assert f"{round(100 * (last - first) / job)} %" in text
    assert not blocks_of(sections, Verdict)  # initialization (55 s) was well within its 20 minutes


def test_initialization_comes_first_when_it_outlasted_the_loop(tmp_path_factory):
    ctx = built("slow_start", tmp_path_factory)
    sections = analysis.build(ctx)
    assert [s.title for s in sections] == ["Analyzing initialization", "Analyzing the training loop"]
    assert all(s.level == 2 for s in sections)
    init = sections[0]
    assert f"took {INIT_MINUTES} min 00 s" in init.blocks[0].text
    verdict = blocks_of([init], Verdict)
    assert len(verdict) == 1 and verdict[0].level == WARN and "threshold of 20 minutes" in verdict[0].text
    rows = _runs.rows_by(_runs.table([init], "When each node started"), "Node")
    assert rows[("slow",)]["Initialization [s]"] == INIT_MINUTES * 60
    first, last = _loop_bounds(ctx)
    assert f"lasted {duration((last - first) / 1e6)}" in sections[1].blocks[0].text


def test_without_steps_the_heading_says_the_loop_is_unknown_and_how_to_record_it(tmp_path_factory):
    sections = analysis.build(built("cpu_only", tmp_path_factory))
    assert [s.title for s in sections] == ["Analyzing the training loop"]
    (text,) = [b.text for b in sections[0].blocks if isinstance(b, Paragraph)]
    assert "No training step was recorded" in text and HOW_TO_RECORD in text


def test_the_subsections_are_level_three_with_distinct_ids(any_run):
    sections = [s for m in SUBSECTIONS for s in m.build(any_run)]
    assert len(sections) == len(SUBSECTIONS) and all(s.level == 3 and s.blocks for s in sections)
    assert len({s.id for s in sections}) == len(sections)
    for s in sections:  # every one ends with a verdict, or says plainly that it does not apply
        assert type(s.blocks[-1]).__name__ in ("Verdict", "NotApplicable"), s.title


def test_every_chart_serializes_and_stays_small(any_run):
    for module in SUBSECTIONS:
        for chart in blocks_of(module.build(any_run), Chart):
            text = json.dumps(chart.model.to_json())
            assert len(text) < 60_000, (module.__name__, chart.caption, len(text))
            for src in _runs.sources(chart.model):  # aggregates: bins, boxes, slices, listed outliers
                assert all(len(v) <= 200 for v in src.data.values()), (module.__name__, chart.caption)


def test_a_run_shorter_than_the_rules_patience_is_stated_not_judged(tmp_path_factory):
    """The GPU run (600 snapshots) with the rules' defaults (patience 1000): nothing analyzed, no verdict."""
    ctx = _runs.context(Path(built("gpu", tmp_path_factory).run.uri), params={})
    for module in (gpu_utilization, load_balancing, batch_size, cpu_bottlenecks, io_bottlenecks, gpu_memory):
        (sec,) = module.build(ctx)
        (na,) = sec.blocks
        assert isinstance(na, NotApplicable) and na.reason.startswith("The run is too short for"), sec.title
        assert "skips the first 1000 snapshots" in na.reason


def test_tables_hold_plain_values(any_run):
    for module in (analysis, *SUBSECTIONS):
        for t in blocks_of(module.build(any_run), Table):
            for row in t.rows:
                assert len(row) == len(t.columns)
                assert all(v is None or isinstance(v, (str, int, float, bool)) and not isinstance(v, np.generic)
                           for v in row), (t.caption, row)


def test_a_fired_rule_without_longer_initialization_still_says_so(tmp_path_factory):
    """A 21-minute start before a 30-minute loop: the loop comes first, the rule's verdict is kept."""
    from ....analyze.rules._fw_gen import MINUTE, T0, FwGen
    from ....analyze.rules._gen import make_node

    gen = FwGen()
    _, ends = gen.steps(node="n", n=300, start_us=T0 + 21 * MINUTE, step_us=6_000_000, jitter_us=0, gap_us=0)
    root = _runs.write_run(tmp_path_factory.mktemp("late") / "run", [make_node("n", 50, gpus=0, start_us=T0)],
                           gen.table(), end_us={"n": int(ends[-1])})
    sections = analysis.build(_runs.context(root))
    assert [s.title for s in sections] == ["Analyzing the training loop"]
    (verdict,) = blocks_of(sections, Verdict)
    assert verdict.level == WARN and "21 min 00 s" in verdict.text
