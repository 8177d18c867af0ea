"""StepOutlier and MaxInitializationTime on generated framework events with planted patterns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from stallwatch.analyze.rules.base import Chunk, ParameterError
from stallwatch.analyze.judge.feed import split_by_time
from stallwatch.analyze.rules.max_initialization_time import MaxInitializationTime
from stallwatch.analyze.rules.step_outlier import StepOutlier
from stallwatch.records import EVAL, GLOBAL, TRAIN

from ._fw_gen import MINUTE, MS, T0, FwGen, S, assert_chunk_invariant, evaluate, node_info, run_info, snapshots, whole

SLOW = 1 * S  # a planted outlier step: 1 s among ~100 ms steps


def slow_steps(count: int, every: int = 37, offset: int = 5) -> dict[int, int]:
    return {offset + i * every: SLOW for i in range(count)}


# ---------------------------------------------------------------------------------------------- StepOutlier


@pytest.mark.parametrize("planted, fires", [(10, False), (11, True)])
def test_step_outlier_fires_only_above_n_outliers(planted, fires):
    """Planted: rank 0 TRAIN, 600 steps of 100±1 ms, `planted` of them 1 s long (n_outliers=10)."""
    gen = FwGen()
    gen.steps(n=600, slow=slow_steps(planted))
    out = evaluate(StepOutlier, whole(gen.table()))
    entry = out["Details"]["step_details"]["algo-1/0/TRAIN"]
    assert entry["number_of_outliers"] == planted
    assert sorted(entry["step_numbers"]) == sorted(slow_steps(planted))
    assert entry["outliers"] == [1.0] * planted
    assert entry["triggered"] is fires
    assert (out["RuleTriggered"], out["Violations"]) == ((1, planted) if fires else (0, 0))
    assert out["Datapoints"] == 600
    assert out["Status"] == "ok"
    assert out["RuleParameters"] == "threshold:3\nmode:None\nn_outliers:10\nstddev:3\nmin_excess_pct:5.0"
    # 11 stalls of 0.9 s over a 60 s loop: 9.9 s, 14 % of the series' time, is well above min_excess_pct
    assert entry["excess_s"] == pytest.approx(planted * 0.9, rel=0.02)


@pytest.mark.parametrize("min_excess_pct, fires", [(19.0, False), (18.0, True)])
def test_step_outlier_fires_only_when_the_outliers_cost_enough(min_excess_pct, fires):
    """Planted: 600 steps of 100 ms, 15 of 1 s: excess 15 × 0.9 s = 13.5 s of 73.5 s (18.4 %) of the series'
    time; the rule fires when that share reaches min_excess_pct."""
    gen = FwGen()
    gen.steps(n=600, slow=slow_steps(15))
    out = evaluate(StepOutlier, whole(gen.table()), min_excess_pct=min_excess_pct)
    entry = out["Details"]["step_details"]["algo-1/0/TRAIN"]
    assert entry["number_of_outliers"] == 15
    assert entry["excess_pct"] == pytest.approx(100 * 15 * 0.9 / (585 * 0.1 + 15 * 1.0), rel=0.02)
    assert entry["triggered"] is (entry["excess_pct"] >= min_excess_pct) is fires


def test_step_outlier_is_silent_on_the_jitter_of_a_long_healthy_run():
    """Planted: 200,000 sub-millisecond steps (500 µs ± 5 µs) with 3σ jitter outliers (a few µs each) —
    an absolute count of outliers in the thousands, but their excess is a tiny share of the loop."""
    rng = np.random.default_rng(7)
    n = 200_000
    dur = (500 + rng.normal(0, 5, n)).astype(np.int64)
    jitter = rng.choice(n, 2_000, replace=False)
    dur[jitter] += 40  # well above mean + 3σ, each 40 µs
    start = T0 + np.cumsum(np.r_[0, dur[:-1] + 10])
    table = pa.table({"node": pa.array(["algo-1"] * n).dictionary_encode(), "rank": pa.array(np.zeros(n, np.int32)),
                      "pid": pa.array(np.ones(n, np.int32)), "kind": pa.array(["step"] * n).dictionary_encode(),
                      "name": pa.array(["train_step"] * n).dictionary_encode(),
                      "mode": pa.array([TRAIN] * n).dictionary_encode(), "step": pa.array(np.arange(n)),
                      "start_us": pa.array(start), "end_us": pa.array(start + dur), "args": pa.array([""] * n)})
    out = evaluate(StepOutlier, whole(table))
    entry = out["Details"]["step_details"]["algo-1/0/TRAIN"]
    assert entry["number_of_outliers"] >= 2_000 and entry["excess_pct"] < 1.0
    assert out["RuleTriggered"] == 0 and entry["triggered"] is False


def test_step_outlier_stats_histogram_and_context_in_seconds():
    """Planted: 300 TRAIN steps of exactly 100 ms (no jitter), 12 of 1 s whose data wait is 900 ms."""
    gen = FwGen()
    slow = slow_steps(12, every=20)
    waits = [900 * MS if i in slow else 5 * MS for i in range(300)]
    gen.steps(n=300, jitter_us=0, slow=slow, data_wait_us=waits)
    out = evaluate(StepOutlier, whole(gen.table()))
    e = out["Details"]["step_details"]["algo-1/0/TRAIN"]
    assert e["step_stats"]["max"] == 1.0 and e["step_stats"]["min"] == 0.1 and e["step_stats"]["p50"] == 0.1
    assert e["step_stats"]["mean"] == pytest.approx((288 * 0.1 + 12 * 1.0) / 300)
    assert e["phase"] == TRAIN and e["steps"] == 300
    assert e["stddev"] == pytest.approx(((0.9 ** 2) * 12 * 288 / 300 ** 2) ** 0.5)
    # histogram of the normal steps only: every one of them is 100 ms
    assert len(e["binedges"]) == len(e["probs"]) + 1 and sum(e["probs"]) == pytest.approx(1.0)
    assert e["binedges"][0] <= 0.1 <= e["binedges"][-1] and e["binedges"][-1] < 1.0
    ctx = e["framework_context"]
    assert ctx["outlier_steps"]["data_wait"] == pytest.approx(0.9)
    assert ctx["normal_steps"]["data_wait"] == pytest.approx(0.005)
    assert out["Details"]["phase"] == {TRAIN: 100.0}
    assert max(out["Details"]["forward_backward"], key=out["Details"]["forward_backward"].get) == "data_wait"
    assert "waiting for data" in out["Recommendation"] and "algo-1/0/TRAIN" in out["Recommendation"]


def test_step_outlier_per_rank_and_phase_and_mode_filter():
    """Planted: rank 0 TRAIN with 11 outliers; rank 0 EVAL with 3; rank 1 TRAIN clean; rank 1 GLOBAL with 12."""
    gen = FwGen()
    gen.steps(rank=0, mode=TRAIN, n=400, slow=slow_steps(11))
    gen.steps(rank=0, mode=EVAL, n=200, step_us=40 * MS, start_us=T0 + 60 * S, slow=slow_steps(3))
    gen.steps(rank=1, mode=TRAIN, n=400)
    gen.steps(rank=1, mode=GLOBAL, n=300, start_us=T0 + 60 * S, slow=slow_steps(12, every=20))
    chunk = whole(gen.table())
    out = evaluate(StepOutlier, chunk)
    details = out["Details"]["step_details"]
    assert list(details) == ["algo-1/0/TRAIN", "algo-1/0/EVAL", "algo-1/1/TRAIN", "algo-1/1/GLOBAL"]
    assert [d["number_of_outliers"] for d in details.values()] == [11, 3, 0, 12]
    assert (out["RuleTriggered"], out["Violations"], out["Datapoints"]) == (2, 23, 1300)
    assert set(out["Details"]["phase"]) == {TRAIN, GLOBAL}

    only_eval = evaluate(StepOutlier, chunk, mode="eval")  # any case
    assert only_eval["Parameters"]["mode"] == EVAL and "mode:EVAL" in only_eval["RuleParameters"]
    assert list(only_eval["Details"]["step_details"]) == ["algo-1/0/EVAL"]
    assert (only_eval["RuleTriggered"], only_eval["Datapoints"]) == (0, 200)

    only_global = evaluate(StepOutlier, chunk, mode="GLOBAL")
    assert (only_global["RuleTriggered"], only_global["Violations"]) == (1, 12)

    stricter = evaluate(StepOutlier, chunk, n_outliers=11)  # 11 outliers is not more than 11
    assert (stricter["RuleTriggered"], stricter["Violations"]) == (1, 12)


def test_step_outlier_stddev_is_the_multiplier():
    """Planted: 12 steps of 200 ms among 100 ms steps: outliers at stddev 3, not at stddev 10 (their excess,
    1.2 % of the loop, is below min_excess_pct: set to 0 here, the count alone decides)."""
    gen = FwGen()
    gen.steps(n=1000, jitter_us=0, slow={i * 80: 200 * MS for i in range(12)})
    chunk = whole(gen.table())
    assert evaluate(StepOutlier, chunk, min_excess_pct=0)["RuleTriggered"] == 1
    assert evaluate(StepOutlier, chunk, min_excess_pct=0, stddev=10)["RuleTriggered"] == 0
    assert evaluate(StepOutlier, chunk, min_excess_pct=0, threshold=10)["RuleTriggered"] == 1  # a report name only
    assert evaluate(StepOutlier, chunk)["RuleTriggered"] == 0  # 1.2 s of excess in a 101 s loop: not a finding


def test_step_outlier_lists_at_most_100_slowest_outliers():
    """Planted: 150 outliers of increasing duration (1.0 s … 1.149 s) among 5000 steps."""
    gen = FwGen()
    slow = {10 + 30 * i: SLOW + i * MS for i in range(150)}
    gen.steps(n=5000, jitter_us=0, slow=slow)
    e = evaluate(StepOutlier, whole(gen.table()))["Details"]["step_details"]["algo-1/0/TRAIN"]
    assert e["number_of_outliers"] == 150 and e["outliers_listed"] == 100
    assert e["step_numbers"] == sorted(e["step_numbers"]) == [10 + 30 * i for i in range(50, 150)]


def test_step_outlier_not_applicable_without_framework_data():
    system = {"algo-1": snapshots("algo-1", T0, T0 + 100 * S, cpu__cpu_util=50)}
    out = evaluate(StepOutlier, whole(None, system, run_info(node_info())))
    assert out["Status"] == "not_applicable" and out["Datapoints"] == 0 and "no framework data" in out["Message"]
    gen = FwGen()
    gen.steps(mode=TRAIN, n=10)
    out = evaluate(StepOutlier, whole(gen.table()), mode="EVAL")
    assert out["Status"] == "not_applicable" and "no EVAL steps" in out["Message"]


def test_step_outlier_bad_mode_is_a_parameter_error():
    with pytest.raises(ParameterError, match="mode"):
        StepOutlier(mode="training")


def test_step_outlier_chunk_invariance():
    """Planted: two ranks, TRAIN and EVAL, outliers on both sides of n_outliers; cut at random times."""
    gen = FwGen()
    gen.steps(rank=0, n=500, slow=slow_steps(11), seed=1)
    gen.steps(rank=0, mode=EVAL, n=100, start_us=T0 + 60 * S, step_us=30 * MS, slow=slow_steps(2), seed=2)
    gen.steps(rank=1, n=500, slow=slow_steps(10), seed=3)
    out = assert_chunk_invariant(StepOutlier, whole(gen.table()), pieces=25)
    assert out["RuleTriggered"] == 1


def _reference(durations_us: np.ndarray, k: float = 3) -> tuple[float, float, np.ndarray]:
    """What StepOutlier computes, the slow way: numpy mean/std over every step, outliers above mean + k·std."""
    seconds = durations_us / 1e6
    mean, std = seconds.mean(), seconds.std()
    return mean, std, np.flatnonzero(seconds > mean + k * std)


def test_step_outlier_resumed_numbering_and_repeated_step_numbers():
    """Planted: a run resumed at step 10,000,000 (12 slow steps with a 900 ms data wait), then the same step
    numbers again (a second loop that restarts its count), cut at random times: the outliers, their context and
    the loop's own time (outside_phases) agree with a direct computation, and the answer with the cuts."""
    gen = FwGen()
    slow = {10_000_000 + 7 + 30 * i: SLOW for i in range(12)}
    waits = [900 * MS if 10_000_000 + i in slow else 5 * MS for i in range(400)]
    gen.steps(n=400, first_step=10_000_000, slow=slow, data_wait_us=waits, phases=True, seed=4)
    gen.steps(n=100, first_step=10_000_000, start_us=T0 + 100 * S, phases=True, seed=5)
    table = gen.table()
    out = assert_chunk_invariant(StepOutlier, whole(table), pieces=30)
    e = out["Details"]["step_details"]["algo-1/0/TRAIN"]
    steps = table.filter(pc.equal(table["kind"], "step"))
    durations = (steps["end_us"].to_numpy() - steps["start_us"].to_numpy()).astype(np.float64)
    mean, std, outliers = _reference(durations)
    assert e["steps"] == 500 and e["number_of_outliers"] == len(outliers) == 12
    assert e["step_stats"]["mean"] == pytest.approx(mean, rel=1e-12) and e["stddev"] == pytest.approx(std, rel=1e-9)
    assert sorted(e["step_numbers"]) == sorted(slow)
    ctx = e["framework_context"]
    repeated = sum(1 for number in slow if number < 10_000_100)  # the second loop's steps share these numbers
    assert ctx["outlier_steps"]["data_wait"] == pytest.approx(0.9 + 0.005 * repeated / 12)
    # outside_phases of the normal steps, directly: a step's time not covered by its own events (numbers repeat:
    # both loops' events count for each of their steps)
    events = table.filter(pc.not_equal(table["kind"], "step"))
    covered: dict[int, int] = {}
    for number, a, b in zip(events["step"].to_pylist(), events["start_us"].to_pylist(), events["end_us"].to_pylist()):
        covered[number] = covered.get(number, 0) + (b - a)
    normal = [i for i in range(len(durations)) if i not in set(outliers.tolist())]
    numbers = steps["step"].to_pylist()
    outside = [max(durations[i] - covered.get(numbers[i], 0), 0) for i in normal]
    assert ctx["normal_steps"].get("outside_phases", 0.0) == pytest.approx(np.mean(outside) / 1e6, abs=1e-9)


def test_step_outlier_steps_without_a_number_and_numbers_far_apart():
    """Steps with no number (-1) and numbers spread wider than the kept context span still count as steps
    (their whole time is outside phases), with the same answer however the data is cut."""
    gen = FwGen()
    gen.steps(n=200, slow=slow_steps(11, every=15), seed=6)
    gen.steps(n=50, first_step=1 << 30, start_us=T0 + 60 * S, seed=7)
    table = gen.table()
    numbers = table["step"].to_numpy(zero_copy_only=False).copy()
    numbers[:20] = -1  # the first 20 events (steps of the first loop) carry no number
    table = table.set_column(table.schema.get_field_index("step"), "step", pa.array(numbers, pa.int64()))
    out = assert_chunk_invariant(StepOutlier, whole(table), pieces=20)
    assert out["Details"]["step_details"]["algo-1/0/TRAIN"]["steps"] == 250


def test_sum_of_squares_is_exact_for_long_steps():
    from stallwatch.analyze.rules.step_series import _sum_squares

    values = np.array([0, 1, (1 << 31) - 1, 1 << 31, 5 * 3600 * 10**6, 123_456_789], np.int64)
    assert _sum_squares(values) == sum(int(v) ** 2 for v in values)
    big = np.full(100_000, (1 << 31) - 1, np.int64)
    assert _sum_squares(big) == 100_000 * ((1 << 31) - 1) ** 2


# ----------------------------------------------------------------------------------- MaxInitializationTime


def init_run(first_step_after_us: int | None, *, data_until_us: int = 40 * MINUTE, loader: bool = True) -> Chunk:
    """Job starts at T0; snapshots every 10 s until T0 + data_until_us; steps from T0 + first_step_after_us."""
    gen = FwGen()
    if loader:
        gen.dataloader(at_us=T0 + 1 * MINUTE)
    if first_step_after_us is not None:
        gen.steps(n=50, start_us=T0 + first_step_after_us)
    info = node_info(start_us=T0, end_us=T0 + data_until_us)
    system = {"algo-1": snapshots("algo-1", T0, T0 + data_until_us, info=info, cpu__cpu_util=20)}
    return whole(gen.table(), system, run_info(info))


@pytest.mark.parametrize("minutes, fires", [(19, False), (20, False), (21, True)])
def test_max_initialization_time_threshold(minutes, fires):
    """Planted: the first step starts `minutes` after the job (threshold 20 minutes: more than, not equal)."""
    chunk = init_run(minutes * MINUTE)
    out = evaluate(MaxInitializationTime, chunk)
    assert (out["RuleTriggered"], out["Violations"]) == (int(fires), int(fires))
    d = out["Details"]
    assert d["job_start"] == T0 and d["job_end"] == T0 + 40 * MINUTE
    assert d["first_step"] == T0 + minutes * MINUTE  # µs since epoch, like every time
    assert d["last_step"] > d["first_step"] and d["initialization_s"] == minutes * 60
    assert out["Datapoints"] == 50
    assert (str(minutes) in out["Recommendation"]) is fires
    assert evaluate(MaxInitializationTime, chunk, threshold=minutes - 1)["RuleTriggered"] == 1


def test_max_initialization_time_fires_without_any_step_once_the_deadline_passed():
    """Planted: a DataLoader iterator at 1 min, then no step for the 25 minutes the data covers."""
    out = evaluate(MaxInitializationTime, init_run(None, data_until_us=25 * MINUTE))
    assert out["RuleTriggered"] == 1 and out["Details"]["first_step"] is None
    assert "no step after" in out["Message"]
    short = evaluate(MaxInitializationTime, init_run(None, data_until_us=15 * MINUTE))
    assert short["RuleTriggered"] == 0  # the run ended before the deadline


def test_max_initialization_time_live_fires_as_soon_as_data_passes_the_deadline():
    """Planted: the first step at 30 minutes; no framework event before it. Fed live, chunk by chunk."""
    chunk = init_run(30 * MINUTE, loader=False)
    cuts = [T0 + 10 * MINUTE, T0 + 20 * MINUTE - 1, T0 + 21 * MINUTE, T0 + 35 * MINUTE]
    rule = MaxInitializationTime()
    seen = []
    for part in split_by_time(chunk, cuts):
        rule.update(part)
        seen.append(rule.result().triggered)
    # snapshots up to 10 min, up to 19:50, up to 20:50 (deadline passed, no step yet), steps, the end
    assert seen == [0, 0, 1, 1, 1]
    assert rule.result().to_json() == evaluate(MaxInitializationTime, chunk)


def test_max_initialization_time_not_applicable_without_framework_data():
    out = evaluate(MaxInitializationTime, init_run(None, loader=False))
    assert out["Status"] == "not_applicable" and out["Datapoints"] == 0 and "no framework data" in out["Message"]
    assert out["Details"]["job_start"] == T0


def test_max_initialization_time_chunk_invariance():
    assert_chunk_invariant(MaxInitializationTime, init_run(22 * MINUTE), pieces=15)
    assert_chunk_invariant(MaxInitializationTime, init_run(5 * MINUTE), pieces=15)


def test_narrow_columns_hold_int32_until_a_value_does_not_fit_and_read_back_exactly():
    """The rules' per-step columns (step numbers, durations, waits) and StepOutlier's per-step-number tables are
    int32 while every value fits — half the memory of the node being read — and widen to int64 at the first
    value that does not (a 40-minute step, a step number past 2^31); what is read back is the same."""
    from stallwatch.analyze.rules.kit.appendable import Appendable
    from stallwatch.analyze.rules.step_series import _Series

    col = Appendable(narrow=True)
    col.extend(np.array([5, 2**31 - 1, -(2**31)], np.int64))
    assert col._data.dtype == np.int32 and col.view().dtype == np.int64
    col.extend(np.array([2**31, 7], np.int64))
    assert col._data.dtype == np.int64 and col.view().tolist() == [5, 2**31 - 1, -(2**31), 2**31, 7]

    s = _Series()
    numbers = np.arange(10, dtype=np.int64)
    s.add_context(numbers, np.zeros(10, np.int64), np.full(10, 1_000, np.int64))
    assert s.ctx.dtype == np.int32 and s.first.dtype == np.int32
    long_us = 40 * 60 * 1_000_000  # a 40-minute step and 40 minutes of forward in step 3
    s.add_context(np.array([3]), np.array([1]), np.array([long_us]))
    s.add_steps(numbers, numbers * 10**9, np.r_[np.full(3, 2_000), [long_us + 5_000], np.full(6, 2_000)])
    assert s.ctx.dtype == np.int64 and s.first.dtype == np.int64
    ctx = s.context_of(np.arange(10))
    assert ctx[3, 1] == long_us and ctx[3, 0] == 1_000 and ctx[3, -1] == 4_000 and ctx[0, -1] == 1_000
    assert s.dur.view()[3] == long_us + 5_000 and s.context_totals()[-1] == 4_000 + 9 * 1_000
