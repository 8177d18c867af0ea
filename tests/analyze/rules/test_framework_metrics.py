"""OverallFrameworkMetrics on generated framework events (and operator rows) with planted time shares."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from stallwatch.analyze.rules.framework_metrics import OverallFrameworkMetrics
from stallwatch.records import EVAL, GLOBAL, TRAIN

from ._fw_gen import MS, T0, FwGen, S, assert_chunk_invariant, evaluate, node_info, run_info, snapshots, whole

OPERATORS = [  # two windows of rank 0: CPU self time 300 + 100 (+ 100 in window 2), GPU 600 + 400
    {"node": "algo-1", "rank": 0, "window": "detailed-1", "operator": "aten::mm", "device": "cpu", "calls": 10,
     "self_us": 300.0, "total_us": 350.0},
    {"node": "algo-1", "rank": 0, "window": "detailed-1", "operator": "aten::add", "device": "cpu", "calls": 5,
     "self_us": 100.0, "total_us": 100.0},
    {"node": "algo-1", "rank": 0, "window": "detailed-1", "operator": "sgemm_kernel", "device": "cuda", "calls": 10,
     "self_us": 600.0, "total_us": 600.0},
    {"node": "algo-1", "rank": 0, "window": "detailed-2", "operator": "aten::add", "device": "cpu", "calls": 5,
     "self_us": 100.0, "total_us": 100.0},
    {"node": "algo-1", "rank": 0, "window": "detailed-2", "operator": "elementwise_kernel", "device": "cuda",
     "calls": 5, "self_us": 400.0, "total_us": 400.0},
]


def planted(operators=None):
    """Rank 0: 10 TRAIN steps of 100 ms (10 ms apart: 90 ms "others"), then 4 EVAL steps of 50 ms (10 ms apart,
    the first one 10 ms after the last TRAIN step): span 1330 ms = 1000 TRAIN + 200 EVAL + 130 others.
    Each TRAIN step: 10 ms data wait, then forward 27, backward 45, optimizer 9 ms. Rank 1: 5 GLOBAL steps of
    20 ms back to back, two all_reduce collectives of 3 ms."""
    gen = FwGen()
    gen.steps(rank=0, mode=TRAIN, n=10, step_us=100 * MS, jitter_us=0, gap_us=10 * MS, data_wait_us=10 * MS)
    gen.steps(rank=0, mode=EVAL, n=4, step_us=50 * MS, jitter_us=0, gap_us=10 * MS, phases=False,
              start_us=T0 + 1100 * MS)
    gen.steps(rank=1, mode=GLOBAL, n=5, step_us=20 * MS, jitter_us=0, gap_us=0, phases=False)
    gen.events("algo-1", 1, "collective", "all_reduce", GLOBAL, None, [T0 + 1 * MS, T0 + 30 * MS],
               [T0 + 4 * MS, T0 + 33 * MS], args='{"bytes": 4096, "async": false}')
    gen.dataloader(rank=0, at_us=T0 - 1 * S)
    run = run_info(node_info())
    if operators is not None:
        run["operators"] = operators
    return whole(gen.table(), {"algo-1": snapshots("algo-1", T0, T0 + 2 * S, interval_us=S, cpu__cpu_util=10)}, run)


def test_phase_shares_per_rank_and_overall():
    out = evaluate(OverallFrameworkMetrics, planted())
    assert (out["RuleTriggered"], out["Violations"], out["Status"]) == (0, 0, "ok")
    d = out["Details"]
    r0 = d["ranks"]["algo-1/0"]
    assert r0["phase_us"] == {TRAIN: 1_000_000, EVAL: 200_000, "others": 130_000}
    assert r0["phase"] == pytest.approx({TRAIN: 100 * 1000 / 1330, EVAL: 100 * 200 / 1330, "others": 100 * 130 / 1330})
    assert r0["steps"] == 14
    r1 = d["ranks"]["algo-1/1"]
    assert r1["phase_us"] == {GLOBAL: 100_000, "others": 0} and r1["phase"] == {GLOBAL: 100.0, "others": 0.0}
    assert d["phase_us"] == {TRAIN: 1_000_000, EVAL: 200_000, GLOBAL: 100_000, "others": 130_000}
    assert sum(d["phase"].values()) == pytest.approx(100.0)
    assert list(d["phase"])[0] == TRAIN  # largest first: the report reads the first key


def test_forward_backward_and_general_events():
    d = evaluate(OverallFrameworkMetrics, planted())["Details"]
    assert d["forward_backward_us"] == {"forward": 270_000, "backward": 450_000}
    assert d["forward_backward"] == pytest.approx({"backward": 62.5, "forward": 37.5})
    assert d["general_us"] == {"data_wait": 100_000, "optimizer": 90_000, "collective": 6_000}
    assert d["general"]["data_wait"] == pytest.approx(100 * 100 / 196)
    assert d["events"]["collective"] == {"all_reduce": {"count": 2, "total_us": 6_000}}
    assert d["events"]["optimizer"] == {"SGD": {"count": 10, "total_us": 90_000}}
    assert "dataloader" not in d["events"]  # an iterator's creation is a marker, not time spent
    assert d["ranks"]["algo-1/1"]["general_us"] == {"collective": 6_000}


def test_each_modes_steps_say_where_their_time_went_and_training_forward_backward_leaves_evaluation_out():
    """nanoGPT read "forward 53 %" where its training steps spent 39 %: evaluation forwards were in the pie. Per
    mode, each part is a share of that mode's timed step time, the rest "other" (the loop's own code)."""
    gen = FwGen()
    gen.steps(rank=0, mode=TRAIN, n=10, step_us=100 * MS, jitter_us=0, gap_us=0, data_wait_us=10 * MS)
    # EVAL: 10 ms data wait, then a forward of 32 ms, 8 ms of nothing recorded
    gen.steps(rank=0, mode=EVAL, n=5, step_us=50 * MS, jitter_us=0, gap_us=0, data_wait_us=10 * MS,
              start_us=T0 + 1000 * MS)
    gen.events("algo-1", 0, "forward", "Net", TRAIN, None, [T0 + 2 * S], [T0 + 2 * S + 5 * MS])  # outside a step
    d = evaluate(OverallFrameworkMetrics, whole(gen.table(), {"algo-1": snapshots("algo-1", T0, T0 + 3 * S,
                                                                                    interval_us=S)}, run_info(node_info())))["Details"]
    assert d["forward_backward_us"] == {"forward": 270_000, "backward": 450_000}  # no EVAL forward
    train, ev = d["modes"][TRAIN], d["modes"][EVAL]
    assert (train["steps"], train["step_us"], ev["steps"], ev["step_us"]) == (10, 1_000_000, 5, 250_000)
    assert train["parts_us"] == {"backward": 450_000, "forward": 270_000, "data_wait": 100_000, "optimizer": 90_000,
                                 "other": 90_000}
    assert train["parts"] == pytest.approx({"backward": 45.0, "forward": 27.0, "data_wait": 10.0, "optimizer": 9.0,
                                            "other": 9.0})
    assert list(train["parts"]) == ["backward", "forward", "data_wait", "optimizer", "other"]  # largest first
    assert ev["parts"] == pytest.approx({"forward": 64.0, "data_wait": 20.0, "other": 16.0})
    assert d["ranks"]["algo-1/0"]["modes"] == d["modes"]
    assert_chunk_invariant(OverallFrameworkMetrics, whole(gen.table(), {"algo-1": snapshots(
        "algo-1", T0, T0 + 3 * S, interval_us=S)}, run_info(node_info())), pieces=7)


@pytest.mark.parametrize("as_table", [False, True])
def test_cpu_and_gpu_operator_tables(as_table):
    ops = pa.Table.from_pylist(OPERATORS) if as_table else OPERATORS
    d = evaluate(OverallFrameworkMetrics, planted(ops))["Details"]
    assert d["CPU"] == pytest.approx({"aten::mm": 60.0, "aten::add": 40.0})
    assert d["CPU_total"] == {"aten::mm": 300.0, "aten::add": 200.0}
    assert d["GPU"] == pytest.approx({"sgemm_kernel": 60.0, "elementwise_kernel": 40.0})
    assert d["GPU_total"] == {"sgemm_kernel": 600.0, "elementwise_kernel": 400.0}
    assert d["ratio"] == pytest.approx({"GPU": 100 * 1000 / 1500, "CPU": 100 * 500 / 1500})  # labels not swapped
    assert list(d["ratio"]) == ["GPU", "CPU"]
    assert d["operator_windows"] == 2
    assert d["operators"]["CPU"][1] == {"operator": "aten::add", "calls": 10, "self_us": 200.0, "total_us": 200.0,
                                        "percent": pytest.approx(40.0)}


def test_no_operators_no_tables():
    d = evaluate(OverallFrameworkMetrics, planted())["Details"]
    assert not {"CPU", "GPU", "ratio", "operators"} & set(d)


def test_not_applicable_without_framework_data():
    chunk = planted()
    chunk.framework = chunk.framework.slice(0, 0)
    out = evaluate(OverallFrameworkMetrics, chunk)
    assert out["Status"] == "not_applicable" and out["Datapoints"] == 0 and "no framework data" in out["Message"]
    assert out["RuleParameters"] == ""


def test_chunk_invariance_and_operator_rows_given_again_or_once():
    out = assert_chunk_invariant(OverallFrameworkMetrics, planted(OPERATORS), pieces=10)
    assert out["Datapoints"] == planted().framework.num_rows
    # a feed that hands only the new operator rows per chunk ends the same as one that repeats them all
    from ._fw_gen import random_chunks
    chunks = random_chunks(planted(), 4, seed=7)
    for i, c in enumerate(chunks):
        c.run = dict(c.run, operators=OPERATORS[i::4])
    rule = OverallFrameworkMetrics()
    for c in chunks:
        rule.update(c)
    assert json.dumps(rule.result().to_json(), sort_keys=True) == json.dumps(out, sort_keys=True)


def test_sampled_steps_counted_stretches_are_time_in_steps_not_between_them():
    """Steps sampled (analyze/sampled.py): the job timed 10 TRAIN steps, then counted steps for 2 s (an `untimed`
    marker from pause to resume), then timed 10 more. The 2 s are TRAIN time, not "others" (it read "training
    steps 14 % of the loop" on a loop that did nothing else); they are kept apart (`untimed_us`) so that shares
    of step time compare timed phases with timed steps."""
    gen = FwGen()
    gen.steps(rank=0, mode=TRAIN, n=10, step_us=100 * MS, jitter_us=0, gap_us=0, data_wait_us=10 * MS)
    gen.events("algo-1", 0, "untimed", "steps", TRAIN, None, [T0 + 1 * S], [T0 + 3 * S],
               args='{"steps": 20000, "first": 10, "stretches": 1, "us": 2000000}')
    gen.steps(rank=0, mode=TRAIN, n=10, step_us=100 * MS, jitter_us=0, gap_us=0, data_wait_us=10 * MS,
              start_us=T0 + 3 * S)
    table = whole(gen.table(), {"algo-1": snapshots("algo-1", T0, T0 + 5 * S, interval_us=S, cpu__cpu_util=10)},
                  run_info(node_info()))
    d = evaluate(OverallFrameworkMetrics, table)["Details"]
    assert d["phase_us"] == {TRAIN: 4_000_000, "others": 0}
    assert d["untimed_us"] == {TRAIN: 2_000_000} == d["ranks"]["algo-1/0"]["untimed_us"]
    assert d["ranks"]["algo-1/0"]["steps"] == 20  # step records: the timed ones
    assert "untimed" not in d["events"] and "untimed" not in d["ranks"]["algo-1/0"]["events_us"]
