"""A run is plain Parquet that other engines read without stallwatch: the DuckDB and Polars queries printed in
docs/format.md run here, on a real run's files, and agree with stallwatch's own reader."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from stallwatch.records import FrameworkEvent
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation

from ..run_builder import S, make_run

duckdb = pytest.importorskip("duckdb")
pl = pytest.importorskip("polars")

FORMAT_MD = Path(__file__).parents[2] / "docs" / "format.md"
DOC_RUN = "stallwatch-runs/my-run"
T0 = 1_763_794_790_000_000  # 06:59:50 UTC: the run crosses an hour


def _doc_block(language: str, after: str) -> str:
    text = FORMAT_MD.read_text()
    start = text.index(after)
    return re.search(rf"```{language}\n(.*?)```", text[start:], re.S).group(1)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict, dict[tuple[str, int], list[float]]]:
    root = tmp_path_factory.mktemp("q") / "my-run"
    nodes = make_run(root, nodes=("algo-1", "algo-2"), seconds=30, t0=T0)
    rng = np.random.default_rng(3)
    durations: dict[tuple[str, int], list[float]] = {}
    for node in ("algo-1", "algo-2"):
        for rank in (0, 1):
            w = FrameworkWriter(RunLocation(str(root)), node, rank, flush_interval_us=S, max_bytes=1 << 30)
            t, ms = T0, []
            for i in range(200):
                d = int(rng.integers(800, 3000)) * (5 if i % 50 == 7 else 1)
                w.append(FrameworkEvent("step", "train_step", t, t + d, "TRAIN", i, 9, ""))
                w.append(FrameworkEvent("forward", "Net", t + 10, t + 20, "TRAIN", i, 9, ""))
                ms.append(d / 1000)
                t += d + 50
            w.close()
            durations[(node, rank)] = ms
    return root, nodes, durations


def test_duckdb_step_time_p99_per_rank(run):
    root, _, durations = run
    sql = _doc_block("sql", "Step time p99 per rank with DuckDB").replace(DOC_RUN, str(root))
    rows = duckdb.sql(sql).fetchall()
    assert [(node, rank) for node, rank, _, _ in rows] == sorted(durations)
    for node, rank, steps, p99 in rows:
        assert steps == 200
        assert p99 == pytest.approx(float(np.quantile(durations[(node, rank)], 0.99)), rel=1e-9)


def test_polars_gpu_utilization_per_node_per_hour(run):
    root, nodes, _ = run
    code = _doc_block("python", "GPU utilization per node per hour with Polars").replace(DOC_RUN, str(root))
    scope: dict = {}
    exec(compile(code, "format.md", "exec"), scope)
    got = {(r["node"], r["hour"].hour): (r["mean_gpu_util"], r["samples"]) for r in scope["gpu"].to_dicts()}
    want: dict[tuple[str, int], list[float]] = defaultdict(list)
    for node, data in nodes.items():
        for ts, _, device, metric, value in data.rows:
            if (device, metric) == ("gpu0", "gpu_util"):
                want[(node, 6 if ts < T0 + 10 * S else 7)].append(value)
    assert set(got) == set(want) == {("algo-1", 6), ("algo-1", 7), ("algo-2", 6), ("algo-2", 7)}
    for key, values in want.items():
        assert got[key][1] == len(values) and got[key][0] == pytest.approx(np.mean(values), rel=1e-6)
