"""The contract between the rules and whoever shows their results: every rule's Details is read through the typed
record in the rule's own module, each field of which the rule writes (same key, same value, same type), and no
module outside analyze/rules/ reads a key of a rule's Details itself.

Dynamic: the built-in rules evaluated on a real PyTorch training run (examples/train.py under `stallwatch run`) and on
generated runs with GPUs (tests/present/report/sections/_runs.py, written with the store's own writers), each result
read back as stored; each record read from it must give back what the JSON holds, and every field of every record
must be written by its rule on at least one of the runs (or be named in OPTIONAL, with where its rule writes it).
(`kit.details.GenericDetails`, the keys a custom rule may write, is checked with one in tests/analyze/test_findings.py.)
Static: every `.details` outside analyze/rules/ is handed to a record's `from_json`, or is in PASS_THROUGH."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

import stallwatch
from stallwatch.analyze.judge.feed import read_run
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.batch_size import BatchSizeDetails
from stallwatch.analyze.rules.bottleneck import BottleneckDetails
from stallwatch.analyze.rules.dataloader import DataloaderDetails
from stallwatch.analyze.rules.framework_metrics import OverallFrameworkMetricsDetails
from stallwatch.analyze.rules.gpu_memory_increase import GPUMemoryIncreaseDetails
from stallwatch.analyze.rules.input_bound import InputBoundDetails
from stallwatch.analyze.rules.kit.details import Coverage, DetailsRecord, flatten
from stallwatch.analyze.rules.load_balancing import LoadBalancingDetails
from stallwatch.analyze.rules.low_gpu_utilization import LowGPUUtilizationDetails
from stallwatch.analyze.rules.max_initialization_time import MaxInitializationTimeDetails
from stallwatch.analyze.rules.registry import builtin_rules
from stallwatch.analyze.rules.step_outlier import StepOutlierDetails
from stallwatch.analyze.rules.straggler import StragglerDetails
from stallwatch.analyze.rules.system_usage import OverallSystemUsageDetails
from stallwatch.store.reader import open_run
from tests.present.report.sections import _runs

ROOT = Path(__file__).resolve().parents[3]
SRC = Path(stallwatch.__file__).resolve().parent

# rule name -> its Details record (CommunicationBound and CPUContention have theirs: test_communication/_contention)
RECORDS: dict[str, type[DetailsRecord]] = {
    "CPUBottleneck": BottleneckDetails, "IOBottleneck": BottleneckDetails, "Dataloader": DataloaderDetails,
    "InputBound": InputBoundDetails, "GPUMemoryIncrease": GPUMemoryIncreaseDetails, "BatchSize": BatchSizeDetails,
    "LowGPUUtilization": LowGPUUtilizationDetails, "MaxInitializationTime": MaxInitializationTimeDetails,
    "LoadBalancing": LoadBalancingDetails, "StepOutlier": StepOutlierDetails, "Straggler": StragglerDetails,
    "OverallSystemUsage": OverallSystemUsageDetails, "OverallFrameworkMetrics": OverallFrameworkMetricsDetails,
}
# Fields these runs do not reach, each with the module of the rule's room that writes its key.
OPTIONAL = {
    "Coverage.nothing_to_compare": "load_balancing.py", "LoadBalancingDetails.nothing_to_compare": "load_balancing.py",
    "Coverage.not_applicable": "kit/windows.py", "OverallSystemUsageDetails.gpu_memory": "system_usage.py",
    "OperatorTables.cpu": "framework_metrics.py", "OperatorTables.gpu": "framework_metrics.py",
    "OperatorTables.cpu_count": "framework_metrics.py", "OperatorTables.gpu_count": "framework_metrics.py",
    "OverallFrameworkMetricsDetails.operators": "framework_metrics.py",
    "OverallFrameworkMetricsDetails.operator_windows": "framework_metrics.py",
    "OverallFrameworkMetricsDetails.ratio": "framework_metrics.py",
    "Operator.operator": "framework_metrics.py", "Operator.calls": "framework_metrics.py",
    "Operator.self_us": "framework_metrics.py", "Operator.total_us": "framework_metrics.py",
    "Operator.percent": "framework_metrics.py",
}
# `.details` outside analyze/rules/ that is not read through a record, and why.
PASS_THROUGH = {
    ("analyze/results.py", "to_json"): "the result's envelope: Details written as the rule made it",
    ("analyze/timeline.py", "_details"): "hands a result's Details to the records' from_json",
    ("analyze/judge/escalation.py", "_evidence"): "copies the generic headline keys as they are into its record",
}


def _real_run(tmp: Path) -> Path:
    """A short real PyTorch training under `stallwatch run` (CPU, no GPU: the GPU rules do not apply to it)."""
    run = tmp / "real"
    subprocess.run([sys.executable, "-m", "stallwatch", "run", "--report", "off", "--out", str(run), "--",
                    sys.executable, str(ROOT / "examples" / "train.py"), "--epochs", "1", "--train-size", "320",
                    "--eval-size", "64", "--workers", "0"], check=True, capture_output=True, timeout=600)
    return run


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> list[RuleResult]:
    """Every built-in rule's result on each run, as a stored rules/<Name>.json reads back."""
    tmp = tmp_path_factory.mktemp("contract")
    runs = [(_real_run(tmp), {}), (_runs.gpu_run(tmp / "gpu"), _runs.PARAMS),
            (_runs.slow_start_run(tmp / "slow"), _runs.PARAMS), (_runs.cpu_only_run(tmp / "cpu"), _runs.PARAMS)]
    out = []
    for root, params in runs:
        run = open_run(str(root))
        out += _runs.as_stored(evaluate(builtin_rules(), [read_run(run, builtin_rules())], params))
    return out


def _same(stored: Any, read: Any, path: str) -> list[str]:
    """Where `read` (a flattened record) differs from `stored` at a key both have (value and type)."""
    if isinstance(read, dict) and isinstance(stored, dict):
        return [p for k, v in read.items() if k in stored for p in _same(stored[k], v, f"{path}.{k}")]
    if isinstance(read, list) and isinstance(stored, list):
        if len(read) != len(stored):
            return [f"{path}: {len(stored)} items stored, {len(read)} read"]
        return [p for i, (a, b) in enumerate(zip(stored, read)) for p in _same(a, b, f"{path}[{i}]")]
    return [] if stored == read and type(stored) is type(read) else [f"{path}: stored {stored!r}, read {read!r}"]


def _written(record: DetailsRecord, details: Any, seen: set[str]) -> None:
    """The record's fields (Class.field, nested too) whose key the stored Details holds."""
    if not isinstance(details, dict):
        return
    keys = type(record).json_keys()
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        name = f"{type(record).__name__}.{f.name}"
        if f.metadata.get("rest"):
            parts = {k: v for k, v in details.items() if k not in set(keys.values()) and isinstance(v, dict)}
            if parts:
                seen.add(name)
            _walk(getattr(record, f.name), parts, seen)
        elif keys[f.name] in details:
            seen.add(name)
            _walk(getattr(record, f.name), details[keys[f.name]], seen)


def _walk(value: Any, stored: Any, seen: set[str]) -> None:
    if isinstance(value, DetailsRecord):
        _written(value, stored, seen)
    elif isinstance(value, dict) and isinstance(stored, dict):
        for k, v in value.items():
            _walk(v, stored.get(k), seen)
    elif isinstance(value, list) and isinstance(stored, list):
        for v, s in zip(value, stored):
            _walk(v, s, seen)


def _types(hint: Any) -> list[Any]:
    args = typing.get_args(hint)
    return [hint] if not args else [t for a in args for t in _types(a)]


def test_every_record_reads_back_what_its_rule_wrote(stored):
    checked = set()
    for result in stored:
        if result.status != "ok" or result.name not in RECORDS:
            continue
        for cls in (RECORDS[result.name], Coverage):
            assert _same(result.details, flatten(cls.from_json(result.details)), result.name) == [], cls.__name__
        checked.add(result.name)
    assert checked == set(RECORDS)  # every rule applied to one of the runs at least


def test_every_field_a_presenter_reads_is_one_its_rule_writes(stored):
    declared = {f"{c.__name__}.{f.name}" for c in _all_records() for f in dataclasses.fields(c)}
    seen: set[str] = set()
    for result in stored:
        if result.name in RECORDS:
            for cls in (RECORDS[result.name], Coverage):
                _written(cls.from_json(result.details), result.details, seen)
    unseen = declared - seen
    assert unseen <= set(OPTIONAL), sorted(unseen - set(OPTIONAL))
    rules_dir = SRC / "analyze" / "rules"
    for name, module in OPTIONAL.items():  # a field these runs do not reach: its key is written in its room
        cls_name, field_name = name.split(".")
        cls = next(c for c in _all_records() if c.__name__ == cls_name)
        assert f'"{cls.json_keys()[field_name]}"' in (rules_dir / module).read_text(), name


def _all_records() -> list[type]:
    """The records and every record they nest."""
    out: list[type] = []
    todo: list[type] = [*RECORDS.values(), Coverage]
    while todo:
        cls = todo.pop()
        if cls in out:
            continue
        out.append(cls)
        for f in dataclasses.fields(cls):
            todo += [t for t in _types(typing.get_type_hints(cls)[f.name])
                     if isinstance(t, type) and issubclass(t, DetailsRecord)]
    return out


def test_a_stored_result_of_another_shape_reads_as_defaults():
    """A result of an older version or another tool: wrong types and missing keys are the fields' defaults."""
    d = StepOutlierDetails.from_json({"step_details": {"a/0/TRAIN": {"node": 3, "rank": "x", "outliers": [1.5, "y"],
                                                                      "step_stats": []}}, "phase": "TRAIN"})
    s = d.series["a/0/TRAIN"]
    assert (s.node, s.rank, s.outliers, s.step_stats.p50, d.phase) == ("", None, [1.5], None, {})
    assert LowGPUUtilizationDetails.from_json({"n": {"gpu0": {"p50": 5}}}).flagged_windows is None


def _reads_of_details() -> list[tuple[str, str, int]]:
    """(module, enclosing function, line) of every `.details` outside analyze/rules/ not handed to `from_json`."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("analyze/rules/"):
            continue
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr == "details"):
                continue
            up = parents.get(node)
            if isinstance(up, ast.IfExp):  # `x.details if x is not None else {}` handed on
                up = parents.get(up)
            if isinstance(up, ast.Call) and isinstance(up.func, ast.Attribute) and up.func.attr == "from_json":
                continue
            fn = node
            while fn in parents and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fn = parents[fn]
            out.append((rel, getattr(fn, "name", ""), node.lineno))
    return out


def test_no_module_outside_the_rules_reads_a_key_of_their_details():
    reads = [(m, f, line) for m, f, line in _reads_of_details() if (m, f) not in PASS_THROUGH]
    assert reads == [], "read Details through the rule's record (`XDetails.from_json(result.details)`)"
    # and the presenters that show a rule's numbers do read its record
    sections = SRC / "present" / "report" / "sections"
    for module, record in (("steps.py", "StepOutlierDetails"), ("framework.py", "OverallFrameworkMetricsDetails"),
                           ("system_usage.py", "OverallSystemUsageDetails"), ("dataloading.py", "DataloaderDetails")):
        assert f"{record}.from_json(" in (sections / module).read_text(), module

