"""An imported SageMaker job is a stallwatch run: the command line imports it (local folder or S3 prefix), and
`info`, `rules`, `report`, `timeline` and the notebook views work on it. The job is written in SageMaker's
format (tests/importers/sagemaker_output.py) with a planted pattern: two nodes of 4 cores and 2 GPUs sampled
every 500 ms for 3 minutes; GPU utilization is 10 % in the first half and 90 % in the second; each node's
rank runs 40 TRAIN steps (data wait, forward, backward) and 10 EVAL steps; SageMaker's rule reports sit in
the job's rule-output/ prefix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallwatch.store.reader import open_run
from tests.importers.sagemaker_output import Round, trace_file, write_rounds, write_trace

S = 1_000_000
T0 = 1_700_000_000 * S
NODES = ("algo-1", "algo-2")
ROUNDS = 360  # 3 minutes at 500 ms


def _rounds(node_index: int) -> list[Round]:
    out = []
    for i in range(ROUNDS):
        gpu = 10.0 if i < ROUNDS // 2 else 90.0
        out.append(Round(T0 + i * 500_000, [20.0 + node_index + c for c in range(4)], [1.0] * 4, [gpu, gpu + 1],
                         [40.0, 41.0], 25.0, 1e6, 2e6, (5e5, 1e4), (2e5, 1e3)))
    return out


def _timeline(node: str, rank: int) -> list[dict]:
    events = []
    t = 1_000_000
    for i in range(40):
        events += [
            {"name": "Step:ModeKeys.TRAIN", "pid": 1, "ph": "X", "ts": t, "dur": 2_000_000,
             "args": {"pid": 100 + rank, "step_num": str(i)}},
            {"name": "_SingleProcessDataLoaderIter.DataLoaderIter::GetNext", "pid": 4, "ph": "X", "ts": t + 1_000,
             "dur": 500_000},
            {"name": "Net", "pid": 2, "ph": "X", "ts": t + 600_000, "dur": 600_000, "args": {"step_num": str(i)}},
            {"name": "Net", "pid": 3, "ph": "X", "ts": t + 1_300_000, "dur": 600_000, "args": {"step_num": str(i)}},
        ]
        t += 2_100_000
    for i in range(10):
        events.append({"name": "Step:ModeKeys.EVAL", "pid": 5, "ph": "X", "ts": t, "dur": 800_000,
                       "args": {"pid": 100 + rank, "step_num": str(i)}})
        t += 900_000
    return events


def _rule_report(name: str, triggered: int) -> dict:
    """A rule report as SageMaker's ProfilerReport wrote it (keys the seeds' report notebook reads)."""
    return {"RuleTriggered": triggered, "Violations": triggered, "Datapoints": 720,
            "RuleParameters": "threshold:50\ncpu_threshold:90\ngpu_threshold:10\npatience:1000",
            "Details": {"CPU": {"algo-1": {"p95": 24.0, "p50": 22.0}}, "GPU": {"algo-1": {"p95": 90.0, "p50": 50.0}}}}


def make_job(root: Path) -> Path:
    """<root>/job/profiler-output (the source) and <root>/job/rule-output."""
    src = root / "job" / "profiler-output"
    for n, node in enumerate(NODES):
        write_rounds(src, node, _rounds(n))
        path = trace_file(src, f"{n}-{node}", "pythontimeline.json", T0 + 120 * S)
        write_trace(path, T0, {1: "Step:ModeKeys.TRAIN", 2: "Forward", 3: "Backward(post-forward)",
                               4: "DataLoaderIter", 5: "Step:ModeKeys.EVAL"}, _timeline(node, n))
    reports = root / "job" / "rule-output" / "ProfilerReport-1700000000" / "profiler-output" / "profiler-reports"
    reports.mkdir(parents=True)
    for name, fired in (("CPUBottleneck", 0), ("LowGPUUtilization", 3), ("OverallSystemUsage", 0)):
        (reports / f"{name}.json").write_text(json.dumps(_rule_report(name, fired)))
    (reports.parent / "profiler-report.html").write_text("<html></html>")
    return src


@pytest.fixture
def imported(tmp_path: Path, run_stallwatch) -> Path:
    src = make_job(tmp_path)
    out = tmp_path / "runs" / "imported"
    done = run_stallwatch("import-sagemaker", str(src), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(out)
    return out


def test_import_then_info(imported: Path, run_stallwatch) -> None:
    run = open_run(str(imported))
    assert run.nodes == list(NODES)
    assert run.ranks() == {"algo-1": ["0"], "algo-2": ["1"]}
    for node in NODES:
        wide = run.system_wide(node)
        assert wide.num_rows == ROUNDS
        assert wide["gpu0/gpu_util"].to_pylist() == [10.0] * (ROUNDS // 2) + [90.0] * (ROUNDS // 2)
    steps = run.framework(kinds=["step"])
    assert sorted(zip(steps["node"].cast("string").to_pylist(), steps["mode"].cast("string").to_pylist())).count(
        ("algo-1", "TRAIN")) == 40
    info = run_stallwatch("info", str(imported))
    assert info.returncode == 0, info.stderr
    assert "wrong type" not in info.stderr  # ranks whose pid is unknown (null) are read, not warned and dropped
    assert "imported   from SageMaker Debugger" in info.stdout
    assert "algo-2" in info.stdout and "TRAIN" in info.stdout and "EVAL" in info.stdout
    record = run.info["imported"]
    assert record["complete"] is True and record["losses"] == []
    assert record["rules"] == ["CPUBottleneck", "LowGPUUtilization", "OverallSystemUsage"]


def test_rules_run_beside_the_imported_ones(imported: Path, run_stallwatch) -> None:
    rules_dir = imported / "rules"
    imported_before = {p.name: p.read_bytes() for p in rules_dir.iterdir()}
    assert set(imported_before) == {"SageMaker.CPUBottleneck.json", "SageMaker.LowGPUUtilization.json",
                                    "SageMaker.OverallSystemUsage.json"}
    sm = json.loads(imported_before["SageMaker.LowGPUUtilization.json"])
    assert sm["RuleName"] == "SageMaker.LowGPUUtilization" and sm["RuleTriggered"] == 3
    assert sm["Imported"]["from"] == "SageMaker Debugger" and sm["Details"]["GPU"]["algo-1"]["p95"] == 90.0
    done = run_stallwatch("rules", str(imported), timeout=300)
    assert done.returncode == 0, done.stderr
    own = json.loads((rules_dir / "OverallSystemUsage.json").read_text())
    assert own["Status"] == "ok" and "Imported" not in own
    for name, data in imported_before.items():  # SageMaker's results are kept as they were
        assert (rules_dir / name).read_bytes() == data
    step_outlier = json.loads((rules_dir / "StepOutlier.json").read_text())
    assert step_outlier["Datapoints"] == 2 * 50  # every imported step, both ranks


def test_report_and_timeline(imported: Path, run_stallwatch, tmp_path: Path) -> None:
    done = run_stallwatch("report", str(imported), timeout=300)
    assert done.returncode == 0, done.stderr
    html = (imported / "report.html").read_text()
    assert "algo-2" in html and "LowGPUUtilization" in html
    # once stallwatch's own results are stored, the report's rules summary lists SageMaker's beside them
    assert run_stallwatch("rules", str(imported), timeout=300).returncode == 0
    assert run_stallwatch("report", str(imported), timeout=300).returncode == 0
    assert "SageMaker.LowGPUUtilization" in (imported / "report.html").read_text()
    out = tmp_path / "timeline.json"
    done = run_stallwatch("timeline", str(imported), "-o", str(out), timeout=300)
    assert done.returncode == 0, done.stderr
    events = json.loads(out.read_text())["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step" and e.get("ph") == "X"]
    assert len(steps) == 2 * 50
    assert sum(1 for e in events if e.get("cat") == "forward") == 2 * 40


def test_notebook_views(imported: Path) -> None:
    from stallwatch.notebook import Heatmap, MetricsHistogram, StepHistogram, Timeline

    for view in (MetricsHistogram(str(imported)), StepHistogram(str(imported)), Heatmap(str(imported)),
                 Timeline(str(imported))):
        assert view.figure is not None


def test_s3_source(tmp_path: Path, s3_server, s3_env, bucket: str, run_stallwatch) -> None:
    """The same job uploaded to a bucket (moto server), imported from its prefix into a local run."""
    src = make_job(tmp_path / "local")
    client = s3_server.client()
    for path in (tmp_path / "local" / "job").rglob("*"):
        if path.is_file():
            key = "jobs/" + str(path.relative_to(tmp_path / "local"))
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    out = tmp_path / "from-s3"
    done = run_stallwatch("import-sagemaker", f"s3://{bucket}/jobs/job/profiler-output", "--out", str(out),
                          env=s3_env)
    assert done.returncode == 0, done.stderr
    local = tmp_path / "from-local"
    assert run_stallwatch("import-sagemaker", str(src), "--out", str(local)).returncode == 0
    a, b = open_run(str(out)), open_run(str(local))
    for node in NODES:
        assert a.system_wide(node).equals(b.system_wide(node))
    assert a.framework().equals(b.framework())
    assert sorted(p.name for p in (out / "rules").iterdir()) == sorted(p.name for p in (local / "rules").iterdir())


def test_s3_destination(tmp_path: Path, s3_env, bucket: str, run_stallwatch) -> None:
    src = make_job(tmp_path)
    uri = f"s3://{bucket}/runs/imported"
    done = run_stallwatch("import-sagemaker", str(src), "--out", uri, env=s3_env)
    assert done.returncode == 0, done.stderr
    run = open_run(uri)
    assert run.nodes == list(NODES) and run.system_wide("algo-1").num_rows == ROUNDS


@pytest.mark.parametrize("source, why", [
    ("{tmp}/missing", "is not a directory"),
    ("{tmp}/empty", "holds no SageMaker Debugger profiler output"),
    ("ftp://host/x", "unsupported"),
])
def test_bad_source_is_one_clear_line(tmp_path: Path, run_stallwatch, source: str, why: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("nothing here")
    done = run_stallwatch("import-sagemaker", source.format(tmp=tmp_path), "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and why in lines[0] and lines[0].startswith("stallwatch import-sagemaker: ")
    assert not (tmp_path / "run").exists()


def test_unreachable_bucket_is_one_clear_line(tmp_path: Path, run_stallwatch) -> None:
    from tests.store.s3_server import closed_port, s3_environment

    env = s3_environment(f"http://127.0.0.1:{closed_port()}", tmp_path / "cache")
    done = run_stallwatch("import-sagemaker", "s3://bucket/job/profiler-output", "--out", str(tmp_path / "run"),
                          env=env)
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot list s3://bucket/job/profiler-output" in lines[0]


def test_never_imports_over_a_run(imported: Path, run_stallwatch, tmp_path: Path) -> None:
    before = sorted(str(p) for p in imported.rglob("*"))
    done = run_stallwatch("import-sagemaker", str(tmp_path / "job" / "profiler-output"), "--out", str(imported))
    assert done.returncode == 2 and "is not empty" in done.stderr
    assert sorted(str(p) for p in imported.rglob("*")) == before
