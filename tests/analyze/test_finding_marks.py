"""Where the top findings happened, as timeline overlays: windows as spans, steps as markers at the steps' real
starts on the ranks the finding names (a generated run with its planted CPU bottleneck and slow steps)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.finding import Finding, Where
from stallwatch.analyze.finding_marks import finding_marks
from stallwatch.records import STEP, TRAIN
from tests.present.report._full_runs import full_run


@pytest.fixture(scope="module")
def analysis(tmp_path_factory: pytest.TempPathFactory) -> RunAnalysis:
    return RunAnalysis(str(full_run(tmp_path_factory.mktemp("marks") / "run", nodes=("algo-1", "algo-2"),
                                    ranks=2).root))


def _finding(rule: str, where: Where) -> Finding:
    return Finding(f"{rule.lower()}/x", rule, "warning", f"{rule} happened", 1.0, 0.1, where, {}, "fix it")


def test_windows_become_spans_and_steps_markers_at_their_starts(analysis: RunAnalysis):
    events = [e for e in analysis.step_events.to_pylist() if e["kind"] == STEP and e["mode"] == TRAIN]
    third = sorted((e["start_us"], e["node"], e["rank"]) for e in events if e["step"] == 3)
    _, node, rank = third[-1]  # the rank whose step 3 started last: its own step, not the earliest of all
    assert third[0][0] < third[-1][0]
    hang = _finding("Hang", Where(["algo-2"], ["algo-2/1"], [], [(100, 200), (100, 200)]))
    slow = _finding("Straggler", Where([node], [f"{node}/{rank}"], [7, 3], []))
    spans, markers = finding_marks([hang, slow], analysis.steps)
    assert [(s.start_us, s.end_us, s.label) for s in spans] == [(100, 200, "Finding 1: Hang")]  # one of the twins
    starts = {e["step"]: e["start_us"] for e in events if (e["node"], e["rank"]) == (node, rank)}
    assert [(m.at_us, m.label, m.text) for m in markers] == [
        (starts[3], "Finding 2: Straggler", "Straggler happened: step 3"),
        (starts[7], "Finding 2: Straggler", "Straggler happened: step 7")]


def test_only_the_top_findings_are_marked_and_steps_need_the_events(analysis: RunAnalysis):
    found = [_finding(f"Rule{i}", Where(windows=[(i * 10, i * 10 + 5)] if i % 2 else [], steps=[1]))
             for i in range(5)]
    spans, markers = finding_marks(found, analysis.steps, top=2)
    assert [s.label for s in spans] == ["Finding 2: Rule1"]  # its windows, not its steps too
    assert [m.label for m in markers] == ["Finding 1: Rule0"]  # no windows: its steps
    spans, markers = finding_marks(found, None, top=2)
    assert len(spans) == 1 and markers == []


def test_the_runs_own_findings_are_marked(analysis: RunAnalysis):
    spans, markers = analysis.finding_marks
    top = analysis.findings.findings[:3]
    assert {s.label for s in spans} | {m.label for m in markers} == {f"Finding {i}: {f.rule}"
                                                                      for i, f in enumerate(top, 1)
                                                                      if f.where.windows or f.where.steps}
    outliers = next(f for f in top if f.rule == "StepOutlier")
    marked = [s for s in spans if s.label.endswith("StepOutlier")]
    assert len(marked) == min(20, len(set(map(tuple, outliers.where.windows))))
    assert np.all(np.diff([s.start_us for s in marked]) >= 0)
