"""Timeline section: system metrics per node from a generated run (GPUs included), training phases merged from
the step events and the rules' flagged moments drawn and listed (the analyses themselves: tests/analyze/test_timeline.py)."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.timeline import TIMELINE_METRICS, WINDOW_RULES
from stallwatch.present.report.model import Chart, NotApplicable, Paragraph, Table
from stallwatch.present.report.sections import timeline
from stallwatch.store.reader import open_run
from tests.analyze.rules._gen import INTERVAL_US, START_US, make_node
from tests.present.generated_run import S, write_run
from tests.present.report.sections._timeline_run import busy_run  # noqa: F401 (a fixture)


def _ctx(path) -> RunAnalysis:
    return RunAnalysis(open_run(str(path)))


def _figures(chart: Chart) -> list:
    """The metric panels (the flagged track on top is drawn from the spec's flags and markers)."""
    return list(chart.model.panels)


def _lines(panel) -> dict[str, dict]:
    return {line.name: {"x": line.x, "y": line.y} for line in panel.lines}


@pytest.fixture(scope="module")
def section(busy_run):
    (sec,) = timeline.build(_ctx(busy_run))
    return sec


def test_panels_per_metric_one_line_per_node(section):
    assert section.id == "timeline" and section.title == "Timeline"
    chart = next(b for b in section.blocks if isinstance(b, Chart))
    figs = _figures(chart)
    assert [f.title for f in figs] == [m.title for m in TIMELINE_METRICS]
    for f in figs:
        assert set(_lines(f)) == {"algo-1", "algo-2"}
    gpu = _lines(figs[2])["algo-1"]
    # GPU utilization of algo-1 is the mean of its 4 GPUs: one idles (5 %) during the bottleneck, others ~80 %
    t = START_US + 800 * INTERVAL_US
    during = gpu["y"][np.abs(gpu["x"] - t / 1000) < 60_000]
    assert during.size and np.all(during < 70) and np.all(during > 55)


def test_the_jobs_own_cpu_is_drawn_under_the_hosts(section):
    """A busy host shows whose CPU it was: the job's processes' line below all cores', node by node."""
    figs = _figures(next(b for b in section.blocks if isinstance(b, Chart)))
    host, job = figs[0], figs[1]
    assert job.title == "The job's CPU" and job.y_label == "% of the host"
    for node in ("algo-1", "algo-2"):
        assert np.all(_lines(job)[node]["y"] <= _lines(host)[node]["y"] + 1e-3)


def test_one_snapshot_spike_survives(section):
    chart = next(b for b in section.blocks if isinstance(b, Chart))
    mem = _lines(_figures(chart)[4])["algo-1"]
    # mean of 4 GPUs' memory: 3 at ~40 %, one at 99 % for a single snapshot -> ~55 %
    assert mem["y"].max() > 50
    assert mem["x"][np.argmax(mem["y"])] == (START_US + 2222 * INTERVAL_US) / 1000


def test_phases_shaded_and_merged(section):
    chart = next(b for b in section.blocks if isinstance(b, Chart))
    strips = {r.text[0].split(" ")[0]: {"x0": r.x0} for r in [*chart.model.spans, *chart.model.flags]}
    assert {"Initialization:", "Training", "Evaluation", "Finalization:", "CPU"} <= set(strips)
    train = strips["Training"]
    assert len(train["x0"]) == 2  # two training stretches around the evaluation pass, not one strip per step
    assert train["x0"][0] == (START_US + 60 * S) / 1000  # the first step


def test_markers_drawn_and_listed(section):
    chart = next(b for b in section.blocks if isinstance(b, Chart))
    marks = chart.model.markers
    assert marks and any("step 2000" in t for r in marks for t in r.text)
    labels = [r.label for r in chart.model.flags if not r.label.startswith("Finding ")]  # the rules' own
    windows = {label for _, label in WINDOW_RULES}
    assert labels[0] == "CPU bottleneck" and set(labels[1:]) <= windows
    table = next(b for b in section.blocks if isinstance(b, Table))
    rows = {row[0]: row for row in table.rows}
    # the GPU window rules' flagged windows (the planted idle GPU): drawn as listed, counted as the rule counts
    assert "Low GPU utilization" in labels and 1 <= rows["Low GPU utilization"][1] <= rows["Low GPU utilization"][2]
    assert rows["Training"][1] == 2 and rows["Evaluation"][1] == 1
    # 2 slow steps on 4 ranks: 8 outliers reported by the rule, drawn as 2 marks
    assert rows["Outlier step"][1:3] == [2, 8]
    assert rows["CPU bottleneck"][1] >= 1 and rows["CPU bottleneck"][2] == rows["CPU bottleneck"][1]


def test_cpu_only_run_without_framework(tmp_path):
    write_run(tmp_path / "run", [make_node("algo-1", 400, 4, 0)])
    (sec,) = timeline.build(_ctx(tmp_path / "run"))
    chart = next(b for b in sec.blocks if isinstance(b, Chart))
    titles = [f.title for f in _figures(chart)]
    assert "GPU utilization (mean of the node's GPUs)" not in titles and "CPU utilization (all cores)" in titles
    text = " ".join(b.text for b in sec.blocks if isinstance(b, Paragraph))
    assert "Not recorded on any node: The job's CPU, GPU utilization" in text  # a generated node has no job CPU
    assert "no training steps" in text


def test_no_system_data(tmp_path):
    frame = make_node("algo-1", 10, 2, 0)
    write_run(tmp_path / "run", [frame])
    for path in (tmp_path / "run" / "system").rglob("*"):
        if path.is_file():
            path.unlink()
    (sec,) = timeline.build(_ctx(tmp_path / "run"))
    assert any(isinstance(b, NotApplicable) for b in sec.blocks)


def test_a_fleet_draws_lines_of_the_nodes_that_matter_first_and_says_so(busy_run, monkeypatch):
    """Past MAX_DRAWN_NODES, each panel draws the nodes the findings name first (algo-1: its planted CPU
    bottleneck), and the section says how many of how many."""
    from stallwatch.analyze import analysis as analysis_mod

    monkeypatch.setattr(analysis_mod, "MAX_DRAWN_NODES", 1)
    (sec,) = timeline.build(_ctx(busy_run))
    chart = next(b for b in sec.blocks if isinstance(b, Chart))
    assert all(set(_lines(f)) == {"algo-1"} for f in _figures(chart))
    text = " ".join(b.text for b in sec.blocks if isinstance(b, Paragraph))
    assert "Lines of 1 of the 2 nodes are drawn" in text


def test_the_top_findings_are_marked_where_they_happened(tmp_path):
    from tests.present.report._full_runs import full_run

    ctx = _ctx(full_run(tmp_path / "run", nodes=("algo-1", "algo-2"), ranks=2).root)
    (section,) = timeline.build(ctx)
    table = next(b for b in section.blocks if isinstance(b, Table) and b.caption == "What is shaded and flagged")
    rows = {r[0]: r for r in table.rows}
    top = ctx.findings.findings[:3]
    for i, f in enumerate(top, 1):
        label = f"Finding {i}: {f.rule}"
        assert label in rows, (label, list(rows))
        shown = len(set(map(tuple, f.where.windows))) or len(set(f.where.steps[:20]))
        assert rows[label][1] == shown
    assert [r for r in rows if r.startswith("Finding ")] == [f"Finding {i}: {f.rule}" for i, f in enumerate(top, 1)]
    assert any(isinstance(b, Paragraph) and b.text.startswith('"Finding 1"') for b in section.blocks)
