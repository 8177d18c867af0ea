"""The rule framework: parameters, registration, results in SageMaker's keys, a failing rule isolated,
results written atomically, and `stallwatch rules` on a real stored run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stallwatch.analyze.rules import Chunk, NodeFrame, Rule, register_rule
from stallwatch.analyze.rules.base import ERROR, ParameterError
from stallwatch.analyze.judge.feed import read_run, split_by_time
from stallwatch.analyze.rules.registry import get_rule
from stallwatch.analyze.judge.runner import evaluate, write_results
from stallwatch.records import framework_schema
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run

from ...collect._support import stallwatch as run_cli
from ...run_builder import make_run


class BusyCpu(Rule):
    """A user's rule: counts snapshots whose total CPU is above `threshold`; fires per such snapshot."""

    name = "BusyCpu"
    description = "Counts snapshots with a busy CPU."
    recommendation = "Look at what keeps the CPU busy."
    defaults = {"threshold": 50.0, "patience": 0}

    def __init__(self, **params):
        super().__init__(**params)
        self.seen = self.busy = 0

    def update(self, chunk: Chunk) -> None:
        for frame in chunk.system.values():
            cpu = frame.get("cpu", "cpu_util")
            if cpu is not None:
                self.seen += len(cpu)
                self.busy += int(np.sum(cpu > self.params["threshold"]))

    def result(self):
        if not self.seen:
            return self.not_applicable("no CPU samples")
        return self.make_result(triggered=self.busy, violations=self.busy, datapoints=self.seen,
                                details={"busy": self.busy})


class Broken(Rule):
    name = "Broken"
    defaults = {}

    def update(self, chunk):
        raise ZeroDivisionError("planted")


def _chunk(values, t0=0):
    ts = np.arange(len(values), dtype=np.int64) * 500_000 + t0
    frame = NodeFrame("n1", ts, {"cpu/cpu_util": np.asarray(values, dtype=np.float64)}, {"cpu_cores_logical": 2})
    return Chunk({"n1": frame}, framework_schema().empty_table(), {}, final=True)


def test_parameters_are_typed_from_text_and_unknown_ones_are_named():
    rule = BusyCpu(threshold="70", patience="3")
    assert rule.params == {"threshold": 70.0, "patience": 3}
    with pytest.raises(ParameterError, match="BusyCpu has no parameter 'treshold'; its parameters: threshold, patience"):
        BusyCpu(treshold=1)
    with pytest.raises(ParameterError, match="must be a number"):
        BusyCpu(patience="many")
    with pytest.raises(ParameterError, match="must be a number"):
        BusyCpu(threshold="inf")


def test_continuous_parameters_take_floats_where_the_default_is_whole():
    """`MaxInitializationTime.threshold=0.5` (minutes) was refused because its default (20) is an integer."""
    from stallwatch.analyze.rules.low_gpu_utilization import LowGPUUtilization
    from stallwatch.analyze.rules.max_initialization_time import MaxInitializationTime

    assert MaxInitializationTime(threshold="0.5").params["threshold"] == 0.5
    assert MaxInitializationTime(threshold="2").params["threshold"] == 2
    assert LowGPUUtilization(threshold_p95="72.5").params["threshold_p95"] == 72.5
    with pytest.raises(ParameterError, match="window=2.5: must be an integer"):
        LowGPUUtilization(window="2.5")  # a count stays a count


def test_result_in_sagemakers_keys_plus_structured_parameters():
    (r,) = evaluate([BusyCpu], [_chunk([10, 60, 70, 20])], {"BusyCpu": {"threshold": "55"}})
    j = r.to_json()
    assert j["RuleName"] == "BusyCpu" and j["RuleTriggered"] == 2 and j["Violations"] == 2 and j["Datapoints"] == 4
    assert j["RuleParameters"] == "threshold:55.0\npatience:0" and j["Parameters"] == {"threshold": 55.0, "patience": 0}
    assert j["Status"] == "ok" and j["Description"] and j["Recommendation"]


def test_a_failing_rule_is_an_error_result_and_the_others_still_run():
    results = evaluate([Broken, BusyCpu], [_chunk([90])])
    assert [r.status for r in results] == [ERROR, "ok"]
    assert "ZeroDivisionError: planted" in results[0].message


def test_split_by_time_hands_over_the_same_snapshots():
    chunk = _chunk(list(range(100)))
    parts = split_by_time(chunk, [5_000_000, 12_345_678, 40_000_000])
    assert sum(len(p.system["n1"]) for p in parts) == 100 and [p.final for p in parts] == [False] * 3 + [True]
    whole = evaluate([BusyCpu], [chunk])[0].to_json()
    assert evaluate([BusyCpu], parts)[0].to_json() == whole


def test_a_registered_rule_is_found_by_name():
    register_rule(BusyCpu)
    assert get_rule("busycpu") is BusyCpu
    with pytest.raises(ParameterError, match="no rule named 'Nope'"):
        get_rule("Nope")


def test_results_are_written_one_file_per_rule(tmp_path):
    results = evaluate([BusyCpu], [_chunk([90, 95])])
    location = RunLocation(str(tmp_path))
    assert write_results(location, results) == ["rules/BusyCpu.json"]
    assert json.loads((tmp_path / "rules" / "BusyCpu.json").read_text())["RuleTriggered"] == 2


def test_stallwatch_rules_on_a_stored_run(tmp_path):
    run = tmp_path / "run"
    make_run(run)
    chunk = read_run(open_run(str(run)))
    assert set(chunk.system) == {"algo-1", "algo-2"} and all(len(f) > 0 for f in chunk.system.values())
    p = run_cli(tmp_path, "rules", str(run), "--param", "Nope.x=1")
    assert p.returncode == 2 and "no rule named 'Nope'" in p.stderr
    p = run_cli(tmp_path, "rules", str(run), "--param", "threshold=1")
    assert p.returncode == 2 and "write RULE.parameter=value" in p.stderr


def test_the_readme_custom_rule_example_runs_as_written():
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[3] / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "register_rule" in b]
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    (r,) = evaluate([namespace["BusyCpu"]], [_chunk([95, 10, 99])])
    assert (r.triggered, r.datapoints, r.details) == (2, 3, {"busy_snapshots": 2, "time_at_stake_s": 1.0})
