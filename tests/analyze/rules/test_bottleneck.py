"""CPUBottleneck and IOBottleneck on generated nodes with planted bottlenecks (see _gen.py)."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze.rules.bottleneck import MAX_RANGES, CPUBottleneck, IOBottleneck
from tests.analyze.rules import _gen as g

PATIENCE = 100
EVALUATED = 1000
N = PATIENCE + EVALUATED

# (rule, planting function, name of the busy-side metric, its threshold parameter)
KINDS = [
    pytest.param(CPUBottleneck, g.plant_cpu_bottleneck, "cpu_util", "cpu_threshold", id="cpu"),
    pytest.param(IOBottleneck, g.plant_io_bottleneck, "cpu_iowait", "io_threshold", id="io"),
]


def _plant(plant, frame, a, b, **kw):
    return plant(frame, PATIENCE + a, PATIENCE + b, **kw)  # a, b: evaluated snapshot indices


def _reference_triggered(flags: np.ndarray, threshold: float) -> int:
    """RuleTriggered the slow, obvious way: at each evaluated snapshot, bottlenecks so far vs threshold."""
    fired = seen = bad = 0
    for f in flags:
        seen += 1
        bad += bool(f)
        fired += bad / seen * 100 > threshold
    return fired


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
@pytest.mark.parametrize("share, fires", [(51, True), (49, False)])
def test_share_of_bottleneck_snapshots_on_both_sides_of_threshold(rule_cls, plant, metric, param, share, fires):
    """Pattern: bottlenecks in the LAST `share` % of evaluated snapshots (51 % fires, 49 % does not)."""
    frame = g.make_node(n=N)
    bad = EVALUATED * share // 100
    _plant(plant, frame, EVALUATED - bad, EVALUATED)
    out = g.run(rule_cls(patience=PATIENCE), g.chunk(frame))
    flags = np.zeros(EVALUATED, bool)
    flags[EVALUATED - bad:] = True
    assert out["Status"] == "ok"
    assert out["Datapoints"] == EVALUATED
    assert out["Violations"] == bad
    # the cumulative share only passes 50 % within the last 2 % of snapshots, and only for 51 %
    assert out["RuleTriggered"] == _reference_triggered(flags, 50) == (2 * bad - EVALUATED if fires else 0)
    node = out["Details"]["nodes"]["algo-1"]
    assert node["above_threshold"] is fires
    assert node["percent"] == share
    assert out["Details"]["bottlenecks"]["count"] == bad
    assert out["Details"]["low_gpu_utilization"] == bad
    assert f"in {share} % of the time" in out["Recommendation"]
    assert ("above the threshold" if fires else "below the threshold") in out["Recommendation"]


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
def test_cumulative_condition_matches_reference(rule_cls, plant, metric, param):
    """Pattern: bottlenecks at random snapshots (about 55 %): RuleTriggered as the obvious loop counts it."""
    frame = g.make_node(n=N, seed=3)
    rng = np.random.default_rng(7)
    flags = rng.random(EVALUATED) < 0.55
    for i in np.flatnonzero(flags):
        _plant(plant, frame, i, i + 1)
    out = g.run(rule_cls(patience=PATIENCE), g.chunk(frame))
    assert out["Violations"] == int(flags.sum())
    assert out["RuleTriggered"] == _reference_triggered(flags, 50) > 0


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
def test_snapshot_condition_on_both_sides_of_gpu_and_busy_thresholds(rule_cls, plant, metric, param):
    """Pattern: four runs of 10 snapshots, GPU exactly at / just below gpu_threshold, the core exactly at /
    just above the busy threshold: only 'just below' and 'just above' together make a bottleneck."""
    busy_key = "cpu_util" if metric == "cpu_util" else "iowait"
    limit = rule_cls.defaults[param]
    frame = g.make_node(n=N)
    _plant(plant, frame, 0, 10, gpu_util=10.0, **{busy_key: limit + 0.1})  # GPU not below: no
    _plant(plant, frame, 20, 30, gpu_util=9.9, **{busy_key: float(limit)})  # core not above: no
    _plant(plant, frame, 40, 50, gpu_util=9.9, **{busy_key: limit + 0.1})  # yes
    _plant(plant, frame, 60, 70, gpu_util=9.9, gpu=1, core=3, **{busy_key: limit + 0.1})  # other devices: yes
    out = g.run(rule_cls(patience=PATIENCE), g.chunk(frame))
    assert out["Violations"] == 20
    assert out["Details"]["low_gpu_utilization"] == 30  # 9.9 % three times, 10 % not low
    ranges = out["Details"]["bottlenecks"]["ranges"]
    t = frame.timestamps
    assert ranges == [
        {"node": "algo-1", "start_us": int(t[PATIENCE + 40]), "end_us": int(t[PATIENCE + 49]), "snapshots": 10},
        {"node": "algo-1", "start_us": int(t[PATIENCE + 60]), "end_us": int(t[PATIENCE + 69]), "snapshots": 10},
    ]


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
def test_patience_skips_the_first_snapshots_of_each_node(rule_cls, plant, metric, param):
    """Pattern: bottlenecks during the first `patience` snapshots of two nodes that start at different
    times: none of them counts."""
    a = g.make_node("algo-1", n=N)
    b = g.make_node("algo-2", n=N, start_us=g.START_US + 37 * g.INTERVAL_US, seed=1)
    plant(a, 0, PATIENCE)
    plant(b, 0, PATIENCE)
    out = g.run(rule_cls(patience=PATIENCE), g.chunk(a, b))
    assert out["Datapoints"] == 2 * EVALUATED
    assert out["Violations"] == 0 and out["RuleTriggered"] == 0


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
def test_several_nodes_sum_counts_and_keep_a_breakdown(rule_cls, plant, metric, param):
    """Pattern: node algo-1 60 % bottlenecks (at the start), algo-2 10 %; a third, CPU-only node is skipped."""
    a = g.make_node("algo-1", n=N)
    b = g.make_node("algo-2", n=N + 200, seed=1)
    cpu_only = g.make_node("cpu-1", n=N, gpus=0, seed=2)
    _plant(plant, a, 0, 600)
    _plant(plant, b, 500, 620)
    out = g.run(rule_cls(patience=PATIENCE), g.chunk(a, b, cpu_only))
    nodes = out["Details"]["nodes"]
    assert set(nodes) == {"algo-1", "algo-2"}
    assert nodes["algo-1"]["bottlenecks"] == 600 and nodes["algo-1"]["above_threshold"] is True
    assert nodes["algo-2"]["bottlenecks"] == 120 and nodes["algo-2"]["datapoints"] == EVALUATED + 200
    assert nodes["algo-2"]["above_threshold"] is False
    assert out["Violations"] == 720
    assert out["Datapoints"] == 2 * EVALUATED + 200
    assert out["RuleTriggered"] == nodes["algo-1"]["triggered"] + nodes["algo-2"]["triggered"]
    assert nodes["algo-1"]["triggered"] == EVALUATED  # 100 % at first, still 60 % at the end
    assert out["Details"]["not_applicable"] == {"cpu-1": "no GPU data recorded on node cpu-1"}
    assert "cpu-1" in out["Message"]
    assert out["Recommendation"].startswith(f"{rule_cls.what} bottlenecks on node algo-1 in 60 %")
    assert out["Recommendation"].endswith(rule_cls.recommendation)


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
def test_time_ranges_are_merged_and_capped(rule_cls, plant, metric, param):
    """Pattern: 150 single-snapshot bottlenecks every other snapshot, then one run of 50: 151 ranges,
    the first 100 listed."""
    frame = g.make_node(n=N)
    for i in range(0, 300, 2):
        _plant(plant, frame, i, i + 1)
    _plant(plant, frame, 400, 450)
    out = g.run(rule_cls(patience=PATIENCE), g.chunk(frame))
    b = out["Details"]["bottlenecks"]
    assert b["ranges_total"] == 151 and len(b["ranges"]) == MAX_RANGES
    assert all(r["snapshots"] == 1 and r["start_us"] == r["end_us"] for r in b["ranges"])
    assert b["count"] == 200


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
def test_no_gpu_is_not_applicable(rule_cls, plant, metric, param):
    """Pattern: a CPU-only run (no gpuN columns), cores busy all the time."""
    frame = g.make_node(n=N, gpus=0, cpu_util=97.0, iowait=70.0)
    out = g.run(rule_cls(patience=PATIENCE), g.chunk(frame))
    assert out["Status"] == "not_applicable"
    assert out["Datapoints"] == 0 and out["RuleTriggered"] == 0 and out["Violations"] == 0
    assert "no GPU data" in out["Message"] and out["Details"]["reason"] == out["Message"]


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
def test_total_cpu_column_used_when_no_per_core_columns(rule_cls, plant, metric, param):
    """Pattern: a node that records only the total (`cpu/...`), busy with idle GPUs for 300 snapshots."""
    frame = g.make_node(n=N)
    for k in [c for c in frame.columns if c.startswith("cpu") and c[3].isdigit()]:
        del frame.columns[k]
    frame.columns[g.col("cpu", metric)][PATIENCE:PATIENCE + 300] = 99.0
    g.plant_gpu_util(frame, 0, PATIENCE, PATIENCE + 300, 1.0)
    out = g.run(rule_cls(patience=PATIENCE), g.chunk(frame))
    assert out["Violations"] == 300
    assert out["Details"]["nodes"]["algo-1"]["cores"] == 1


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
def test_one_chunk_and_many_chunks_agree(rule_cls, plant, metric, param):
    """Pattern: bottleneck runs of every length on two nodes, cut at random times (runs span chunks)."""
    a = g.make_node("algo-1", n=N)
    b = g.make_node("algo-2", n=N - 150, start_us=g.START_US + 11 * g.INTERVAL_US + 1234, seed=5)
    rng = np.random.default_rng(11)
    for frame in (a, b):
        i = 0
        while i < len(frame) - PATIENCE:
            length = int(rng.integers(1, 60))
            if rng.random() < 0.6:
                _plant(plant, frame, i, min(i + length, len(frame) - PATIENCE))
            i += length + int(rng.integers(1, 40))
    out = g.assert_chunk_invariant(rule_cls, g.chunk(a, b), {"patience": PATIENCE},
                                   splits=((2, 1), (13, 2), (60, 3)))
    assert out["Violations"] > 0 and out["RuleTriggered"] > 0


def test_parameters_and_texts_follow_rules_md():
    cpu = CPUBottleneck().result().to_json()
    io = IOBottleneck().result().to_json()
    assert cpu["RuleParameters"] == "threshold:50\ncpu_threshold:90\ngpu_threshold:10\npatience:1000"
    assert io["RuleParameters"] == "threshold:50\nio_threshold:50\ngpu_threshold:10\npatience:1000"
    assert CPUBottleneck.recommendation == ("Consider increasing the number of data loaders or applying data "
                                            "pre-fetching.")
    assert cpu["Status"] == io["Status"] == "not_applicable"  # no data at all


@pytest.mark.parametrize("rule_cls, plant, metric, param", KINDS)
def test_framework_context_during_the_bottleneck_periods(rule_cls, plant, metric, param):
    """Pattern: bottleneck snapshots 300..399 (one period of 100 intervals); two ranks run steps all along,
    each step a long wait for data then forward — so during the period the loop mostly waited for data.
    The context (overlap of events with the period) agrees with a direct computation and with any chunking."""
    from stallwatch.analyze.rules.base import Chunk

    from ._fw_gen import FwGen

    frame = g.make_node(n=N)
    _plant(plant, frame, 300, 400)
    t0 = int(frame.timestamps[0])
    interval = int(frame.timestamps[1] - frame.timestamps[0])
    gen = FwGen()
    for rank in (0, 1):
        gen.steps(rank=rank, n=N // 2, start_us=t0, step_us=2 * interval - 1000, gap_us=1000, jitter_us=0,
                  data_wait_us=interval, phases=True, seed=rank)
    events = gen.table()
    whole = Chunk({"algo-1": frame}, events, {}, final=True)
    out = g.assert_chunk_invariant(rule_cls, whole, {"patience": PATIENCE})
    ctx = out["Details"]["framework_context"]["algo-1"]
    lo = int(frame.timestamps[PATIENCE + 300])
    hi = int(frame.timestamps[PATIENCE + 399]) + interval
    assert ctx["bottleneck_s"] == pytest.approx((hi - lo) / 1e6)
    assert ctx["ranks"] == 2 and ctx["events"] == events.num_rows

    def overlap(kind: str) -> float:
        rows = [r for r in events.to_pylist() if r["kind"] == kind]
        return sum(max(0, min(r["end_us"], hi) - max(r["start_us"], lo)) for r in rows) / 1e6

    assert ctx["phases_s"] == {"TRAIN": pytest.approx(overlap("step"))}
    assert ctx["kinds_s"]["data_wait"] == pytest.approx(overlap("data_wait"))
    assert ctx["kinds_s"]["forward"] == pytest.approx(overlap("forward"))
    assert ctx["outside_steps_s"] == pytest.approx(2 * (hi - lo) / 1e6 - overlap("step"))
    assert overlap("data_wait") > overlap("forward") > 0  # the loop mostly waited for data
