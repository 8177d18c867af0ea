"""Many nodes writing one run at once (benchmarks/many_writers.py, shortened): sixteen processes with one host
name claim distinct node names through the launcher's claim and write their snapshots and events together;
the run reads back complete. The same with four writers on the S3 server (conditional-write claims)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")


@pytest.fixture(scope="module")
def many_writers():
    """The benchmark's module, importable by name (its spawned writers import it too)."""
    sys.path.insert(0, BENCHMARKS)
    try:
        yield importlib.import_module("many_writers")
    finally:
        sys.path.remove(BENCHMARKS)


def _assert_complete(mw, uri: str, shape, names: list[str]) -> None:
    # claimed names (vm, vm-2, …); a store that is slow to answer gives a name none other takes (vm-<pid>-<hex>)
    assert len(set(names)) == shape.nodes and all(n == "vm" or n.startswith("vm-") for n in names)
    check = mw.read_back(uri)
    assert sorted(check.nodes) == sorted(names)
    assert check.snapshots == {n: shape.snapshots for n in names}
    assert check.events == {f"{n}/{r}": shape.events_per_rank for n in names for r in range(shape.ranks)}


def test_sixteen_writers_one_local_run(many_writers, tmp_path: Path):
    shape = many_writers.Shape(nodes=16, hours=10 / 60, ranks=2)  # 1,200 snapshots, 2 × 2,400 events per node
    uri = str(tmp_path / "run")
    _assert_complete(many_writers, uri, shape, many_writers.write_run(uri, shape))


def test_four_writers_one_s3_run(many_writers, s3_env, bucket: str):
    shape = many_writers.Shape(nodes=4, hours=5 / 60)
    uri = f"s3://{bucket}/runs/many"
    _assert_complete(many_writers, uri, shape, many_writers.write_run(uri, shape))
