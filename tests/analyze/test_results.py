"""A rule's typed result and its JSON form: to_json → from_json is the identity, SageMaker's files (no
structured Parameters, no Status) read back, and untrusted values never raise."""

from __future__ import annotations

import json

import pytest

from stallwatch.analyze.results import ERROR, NOT_APPLICABLE, OK, RuleResult, by_times_fired, not_applicable_groups


def _result(**changes) -> RuleResult:
    base = dict(name="StepOutlier", triggered=3, violations=12, datapoints=4000,
                parameters={"threshold": 3, "mode": None, "stddev": 3.5}, description="Finds slow steps.",
                recommendation="Look at the slow steps.", details={"step_details": {"vm/0/TRAIN": {"steps": 4000}}})
    base.update(changes)
    return RuleResult(**base)


def test_round_trip_through_json_text():
    r = _result()
    back = RuleResult.from_json(json.loads(json.dumps(r.to_json())))
    assert back == r
    assert r.to_json()["RuleParameters"] == "threshold:3\nmode:None\nstddev:3.5"


def test_sagemaker_record_without_parameters_or_status():
    r = RuleResult.from_json({"RuleName": "CPUBottleneck", "RuleTriggered": 2, "Violations": 5, "Datapoints": 100,
                              "RuleParameters": "threshold:50\ncpu_threshold:90"})
    assert (r.name, r.triggered, r.violations, r.datapoints, r.status) == ("CPUBottleneck", 2, 5, 100, OK)
    assert r.parameters == {"threshold": "50", "cpu_threshold": "90"} and r.details == {}
    assert r.fired and r.applies


@pytest.mark.parametrize("record", [
    {"RuleName": 7, "RuleTriggered": "many", "Violations": -3, "Datapoints": 1e400, "Details": [1, 2],
     "Parameters": "x", "Status": "exploded", "Message": None},
    {"RuleTriggered": float("nan")},
    {},
])
def test_untrusted_values_become_empty_not_errors(record):
    r = RuleResult.from_json(record, default_name="FromFile")
    assert r.triggered == 0 and r.violations == 0 and r.datapoints == 0 and r.details == {}
    assert r.name in ("7", "FromFile") and r.status in (OK, ERROR) and isinstance(r.message, str)


def test_not_an_object_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="a rule result is a JSON object, not list"):
        RuleResult.from_json([1, 2])  # type: ignore[arg-type]


def test_order_and_grouping_helpers():
    results = [_result(name="B", triggered=2), _result(name="A", triggered=2), _result(name="C", triggered=9),
               _result(name="G1", triggered=0, status=NOT_APPLICABLE, message="no GPU data: G1 needs GPUs"),
               _result(name="G2", triggered=0, status=NOT_APPLICABLE, message="no GPU data: G2 needs GPUs")]
    assert [r.name for r in by_times_fired(results)] == ["C", "A", "B", "G1", "G2"]
    assert not_applicable_groups(results) == {"no GPU data: the rule needs GPUs": ["G1", "G2"]}
