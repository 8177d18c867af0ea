"""Per-node usage statistics and spans, checked against numpy on planted tidy tables."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from stallwatch.analyze.usage import NodeSpan, UsageStat, node_spans, usage_stats
from stallwatch.records import system_schema
from stallwatch.store.reader import open_run
from tests.run_builder import T0, S, make_run


def _table(rows: list[tuple[int, str, str, str, float | None]]) -> pa.Table:
    """A tidy table of exactly these rows, in the reader's schema."""
    cols = list(zip(*rows)) if rows else [[], [], [], [], []]
    plain = pa.table({"timestamp_us": pa.array(cols[0], pa.int64()), "node": pa.array(cols[1], pa.string()),
                      "device": pa.array(cols[2], pa.string()), "metric": pa.array(cols[3], pa.string()),
                      "value": pa.array(cols[4], pa.float64())})
    return plain.cast(system_schema())


def _by_label(stats: list[UsageStat], node: str) -> dict[str, UsageStat]:
    return {s.label: s for s in stats if s.node == node}


def _check(stat: UsageStat, values, unit: str) -> None:
    v = np.asarray(values, dtype=np.float64)
    assert stat.unit == unit
    assert stat.count == len(v)
    assert stat.mean == pytest.approx(v.mean())
    assert stat.p50 == pytest.approx(np.percentile(v, 50))
    assert stat.p95 == pytest.approx(np.percentile(v, 95))
    assert stat.max == pytest.approx(v.max())


@pytest.fixture
def planted():
    """Two nodes, 40 snapshots; known per-core, GPU, memory and disk series (the pattern is random but seeded)."""
    rng = np.random.default_rng(3)
    n = 40
    cores = rng.uniform(0, 100, size=(n, 4))
    cores[7, :] = [5.0, 99.5, 3.0, 1.0]  # core 1 alone saturated in snapshot 7
    total = cores.mean(axis=1)
    gpus = rng.uniform(0, 100, size=(n, 2))
    disk = rng.uniform(0, 5e8, size=n)
    rows = []
    for i in range(n):
        ts = T0 + i * 500_000
        rows.append((ts, "a", "cpu", "cpu_util", float(total[i])))
        for c in range(4):
            rows.append((ts, "a", f"cpu{c}", "cpu_util", float(cores[i, c])))
        for g in range(2):
            rows.append((ts, "a", f"gpu{g}", "gpu_util", float(gpus[i, g])))
        rows.append((ts, "a", "disk", "disk_read_bps", float(disk[i])))
        if i < 10:  # node b: only memory, 10 snapshots, one second apart and starting later
            rows.append((T0 + 3 * S + i * S, "b", "memory", "mem_util", float(10 * i)))
    return _table(rows), {"cores": cores, "total": total, "gpus": gpus, "disk": disk}


def test_usage_stats_match_numpy(planted):
    """Mean, p50, p95 and max of each series equal numpy's, per node."""
    table, v = planted
    stats = usage_stats(table)
    a = _by_label(stats, "a")
    assert set(a) == {"CPU total", "CPU busiest core", "GPU", "Disk read"}
    _check(a["CPU total"], v["total"], "%")
    _check(a["GPU"], v["gpus"].ravel(), "%")
    _check(a["Disk read"], v["disk"], "B/s")
    b = _by_label(stats, "b")
    assert set(b) == {"Memory"}
    _check(b["Memory"], [10.0 * i for i in range(10)], "%")
    assert [s.node for s in stats] == ["a"] * 4 + ["b"]


def test_busiest_core_is_the_max_over_cores_per_snapshot(planted):
    """'CPU busiest core' has one value per snapshot: the highest core, never the total 'cpu' device."""
    table, v = planted
    busiest = _by_label(usage_stats(table), "a")["CPU busiest core"]
    per_snapshot = v["cores"].max(axis=1)
    assert per_snapshot[7] == 99.5
    _check(busiest, per_snapshot, "%")


def test_busiest_core_with_unordered_rows_and_missing_cores():
    """Rows out of time order and snapshots with fewer cores still give one max per snapshot."""
    rows = [
        (T0 + 2, "n", "cpu1", "cpu_util", 10.0),
        (T0, "n", "cpu0", "cpu_util", 30.0),
        (T0 + 1, "n", "cpu0", "cpu_util", 70.0),
        (T0, "n", "cpu1", "cpu_util", 50.0),
        (T0 + 2, "n", "cpu0", "cpu_util", 20.0),
        (T0, "n", "cpu", "cpu_util", 99.0),  # the total is not a core
        (T0 + 3, "n", "cpu0", "cpu_util", None),  # a null where every core is missing
        (T0 + 3, "n", "cpu1", "cpu_util", None),
    ]
    busiest = _by_label(usage_stats(_table(rows)), "n")["CPU busiest core"]
    _check(busiest, [50.0, 70.0, 20.0], "%")


def test_nan_values_are_left_out():
    """Null values do not count and do not turn the mean into NaN."""
    rows = [(T0 + i, "n", "memory", "mem_util", None if i % 2 else float(i)) for i in range(6)]
    (mem,) = usage_stats(_table(rows))
    _check(mem, [0.0, 2.0, 4.0], "%")
    assert not math.isnan(mem.mean)


def test_proc_rows_and_units():
    """The job's process tree rows use the proc device; RSS is bytes, workers have no unit."""
    rows = [(T0 + i, "n", "proc", m, float(val)) for i in range(3)
            for m, val in (("cpu_util", 150 + i), ("rss_bytes", 2**30 * (i + 1)), ("workers_alive", 4))]
    got = _by_label(usage_stats(_table(rows)), "n")
    _check(got["Job CPU"], [150.0, 151.0, 152.0], "%")
    _check(got["Job memory (RSS)"], [2.0**30, 2.0**31, 3 * 2.0**30], "B")
    _check(got["Loader workers alive"], [4.0, 4.0, 4.0], "")


def test_node_spans_count_distinct_snapshots(planted):
    """A span counts snapshots (distinct timestamps), not rows, from first to last."""
    table, _ = planted
    assert node_spans(table) == [
        NodeSpan("a", 40, T0, T0 + 39 * 500_000),
        NodeSpan("b", 10, T0 + 3 * S, T0 + 12 * S),
    ]


def test_empty_table_gives_nothing():
    """No rows: no statistics and no spans, rather than an error."""
    empty = system_schema().empty_table()
    assert usage_stats(empty) == []
    assert node_spans(empty) == []


def test_on_a_real_run(tmp_path):
    """On a run read back from disk (chunked dictionary columns) the numbers still match numpy."""
    root = tmp_path / "run"
    nodes = make_run(root, seconds=25, offsets_s=(0, 2))
    table = open_run(str(root)).system()
    spans = node_spans(table)
    assert spans == [NodeSpan("algo-1", 25, T0, T0 + 24 * S), NodeSpan("algo-2", 25, T0 + 2 * S, T0 + 26 * S)]
    stats = _by_label(usage_stats(table), "algo-2")
    rows = nodes["algo-2"].rows
    _check(stats["CPU total"], [r[4] for r in rows if r[2] == "cpu" and r[3] == "cpu_util"], "%")
    _check(stats["GPU"], [r[4] for r in rows if r[2] == "gpu0"], "%")
    busiest: dict[int, float] = {}
    for ts, _, dev, metric, val in rows:
        if dev in ("cpu0", "cpu1") and metric == "cpu_util":
            busiest[ts] = max(busiest.get(ts, -1.0), val)
    _check(stats["CPU busiest core"], [busiest[t] for t in sorted(busiest)], "%")
    assert stats["GPU"].count == 20  # every fifth snapshot has no GPU value


def test_wide_and_tidy_statistics_agree_on_a_real_run(tmp_path):
    """The end-of-run summary reads wide columns (cheap for long runs); it must say what the tidy path says."""
    from stallwatch.analyze.usage import node_span_wide, usage_metrics, usage_stats_wide

    make_run(tmp_path / "run", nodes=("algo-1",), seconds=40)
    run = open_run(str(tmp_path / "run"))
    tidy = usage_stats(run.system(nodes=["algo-1"]))
    wide_table = run.system_wide("algo-1", metrics=usage_metrics())
    wide = usage_stats_wide("algo-1", wide_table)
    assert [s.label for s in tidy] == [s.label for s in wide] and tidy
    for a, b in zip(tidy, wide):
        assert a.count == b.count
        for field in ("mean", "p50", "p95", "max"):
            assert getattr(b, field) == pytest.approx(getattr(a, field), rel=1e-6, abs=1e-6)
    span = node_span_wide("algo-1", wide_table)
    assert span == node_spans(run.system(nodes=["algo-1"]))[0]
