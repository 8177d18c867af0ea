"""Section 4, Rules summary: every rule, most often triggered first (the console's order), the seeds' headline
sentence, and the rules that do not apply or failed said plainly."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult, by_times_fired
from stallwatch.present.report.model import GOOD, ISSUE, WARN, NotApplicable, Paragraph, Table, Verdict
from stallwatch.present.report.sections import rules
from stallwatch.store.reader import open_run

from .._full_runs import full_run


def _result(name: str, triggered: int, datapoints: int, status: str = "ok", message: str = "") -> dict:
    return RuleResult(name, triggered, triggered, datapoints, {"threshold": 3, "mode": None}, f"{name} checks.",
                      f"Fix {name}.", {}, status, message).to_json()


def _build(root: Path, results: dict | None = None):
    typed = None if results is None else [RuleResult.from_json(r) for r in results.values()]
    (section,) = rules.build(RunAnalysis(open_run(str(root)), rule_results=typed))
    assert (section.id, section.title) == ("rules", "Rules summary")
    return section


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return full_run(tmp_path_factory.mktemp("rules") / "run", gpus=0, framework=False).root


def test_sorted_by_times_triggered_with_the_headline(root: Path):
    results = {r["RuleName"]: r for r in (_result("Alpha", 2, 50), _result("Beta", 15, 2111), _result("Gamma", 0, 9),
                                          _result("Delta", 2, 70))}
    section = _build(root, results)
    paragraph = next(b for b in section.blocks if isinstance(b, Paragraph))
    assert paragraph.text.endswith("During your training job, the Beta rule was the most frequently triggered. It "
                                   "processed 2,111 datapoints and was triggered 15 times.")
    table = next(b for b in section.blocks if isinstance(b, Table))
    assert table.columns == ["rule", "description", "recommendation", "fired", "data points", "parameters"]
    assert [r[0] for r in table.rows] == ["Beta", "Alpha", "Delta", "Gamma"]
    ordered = by_times_fired([RuleResult.from_json(r) for r in results.values()])  # the console's order
    assert [r.name for r in ordered] == [r[0] for r in table.rows]
    assert table.rows[0][1:] == ["Beta checks.", "Fix Beta.", 15, 2111, "threshold: 3\nmode: None"]
    verdicts = [b for b in section.blocks if isinstance(b, Verdict)]
    assert [(v.level, v.text) for v in verdicts] == [(WARN, "Beta was triggered 15 times: Fix Beta."),
                                                    (WARN, "Alpha was triggered 2 times: Fix Alpha."),
                                                    (WARN, "Delta was triggered 2 times: Fix Delta.")]


def test_not_applicable_and_failed_rules_are_said_plainly(root: Path):
    results = {"Quiet": _result("Quiet", 0, 10),
               "GPUOne": _result("GPUOne", 0, 0, "not_applicable", "no GPU data: GPUOne needs GPUs"),
               "GPUTwo": _result("GPUTwo", 0, 0, "not_applicable", "no GPU data: GPUTwo needs GPUs"),
               "Broken": _result("Broken", 0, 0, "error", "KeyError: 'x'")}
    section = _build(root, results)
    assert next(b for b in section.blocks if isinstance(b, Paragraph)).text == rules.INTRO  # nothing fired
    assert [r[0] for r in next(b for b in section.blocks if isinstance(b, Table)).rows] == ["Quiet"]
    assert Verdict("No rule was triggered: nothing in this run crossed a rule's threshold.", GOOD) in section.blocks
    assert Verdict("Broken could not be evaluated: KeyError: 'x'", ISSUE) in section.blocks
    assert [b for b in section.blocks if isinstance(b, NotApplicable)] == [
        NotApplicable("Not applicable: GPUOne, GPUTwo — no GPU data: the rule needs GPUs")]


def test_every_builtin_rule_of_a_real_evaluation(root: Path):
    section = _build(root)
    table = next(b for b in section.blocks if isinstance(b, Table))
    not_applicable = [b.reason.split(" — ")[0].removeprefix("Not applicable: ")
                      for b in section.blocks if isinstance(b, NotApplicable)]
    listed = {r[0] for r in table.rows} | {n for names in not_applicable for n in names.split(", ")}
    ctx_rules = RunAnalysis(open_run(str(root))).rules_by_name
    assert listed == set(ctx_rules)
    assert all(r[4] == ctx_rules[r[0]].datapoints for r in table.rows)


def test_sagemaker_files_without_structured_parameters():
    r = RuleResult.from_json({"RuleName": "StepOutlier", "RuleTriggered": 3, "Datapoints": 10,
                         "RuleParameters": "threshold:3\nmode:None\nn_outliers:10\nstddev:3"})
    assert r.parameters == {"threshold": "3", "mode": "None", "n_outliers": "10", "stddev": "3"}
    assert (r.name, r.triggered, r.datapoints, r.status) == ("StepOutlier", 3, 10, "ok")
