"""A folder or bucket prefix of runs: which directories are runs, their records read without samples, a run
given itself, and hostile records skipped — locally and on the S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallwatch.store.catalog import is_run, list_runs, run_records
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import Run, RunNotFoundError
from tests.run_builder import T0, make_run


def _plant(root: str) -> None:
    for i, name in enumerate(("20261101-000000-aaaaaa", "20261102-000000-bbbbbb")):
        loc = RunLocation(f"{root.rstrip('/')}/{name}")
        loc.write_atomic("run.json", json.dumps({"run_id": name, "created_us": T0 + i}).encode())
        loc.write_atomic("nodes/algo-1.json", json.dumps({"node": "algo-1", "start_us": T0 + i, "end_us": T0 + i + 5,
                                                          "status": "finished", "exit_code": i}).encode())
        if i:
            loc.write_atomic("findings.json", json.dumps({"verdict": "ok", "findings": []}).encode())
    RunLocation(f"{root.rstrip('/')}/not-a-run").write_atomic("notes.txt", b"hello")


def test_the_runs_of_a_folder(tmp_path: Path):
    _plant(str(tmp_path))
    found = sorted(list_runs(str(tmp_path)), key=lambda r: r.name)
    assert [r.name for r in found] == ["20261101-000000-aaaaaa", "20261102-000000-bbbbbb"]
    assert found[0].nodes["algo-1"].exit_code == 0 and found[0].findings is None
    assert found[1].findings == {"verdict": "ok", "findings": []}


def test_a_run_given_itself_is_listed_alone(tmp_path: Path):
    root = tmp_path / "r"
    make_run(root)
    (found,) = list_runs(str(root))
    assert found.uri == str(root)


def test_a_run_named_nodes_is_one_run_of_the_folder(tmp_path: Path):
    """A folder of runs holding one whose directory is called `nodes` is a folder, not a run: the child's
    run.json and folders are not this folder's node records."""
    _plant(str(tmp_path))
    make_run(tmp_path / "nodes")
    found = sorted(list_runs(str(tmp_path)), key=lambda r: r.name)
    assert [r.name for r in found] == ["20261101-000000-aaaaaa", "20261102-000000-bbbbbb", "nodes"]
    assert not is_run(RunLocation(str(tmp_path))) and is_run(RunLocation(str(tmp_path / "nodes")))
    with pytest.raises(RunNotFoundError):
        Run(str(tmp_path))
    assert Run(str(tmp_path / "nodes")).info["nodes"]


def test_bad_records_are_skipped(tmp_path: Path):
    loc = RunLocation(str(tmp_path / "run"))
    loc.write_atomic("run.json", b"[not an object]")
    loc.write_atomic("nodes/a.json", b"{broken")
    loc.write_atomic("nodes/b.json", json.dumps({"node": "b"}).encode())
    rec = run_records(loc)
    assert rec is not None and rec.run == {} and list(rec.nodes) == ["b"]
    assert run_records(RunLocation(str(tmp_path / "nothing"))) is None


def test_a_bucket_prefix(s3_env, bucket: str):
    root = f"s3://{bucket}/team/runs"
    _plant(root)
    assert sorted(r.name for r in list_runs(root)) == ["20261101-000000-aaaaaa", "20261102-000000-bbbbbb"]
