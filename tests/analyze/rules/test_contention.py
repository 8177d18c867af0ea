"""CPU contention on generated events: steps that record their training thread's run-queue delay (`runq_us`).
Stalls and slow steps explained by it are not InputBound's or StepOutlier's; CPUContention names it with the cause
the node's snapshots show (a cgroup CPU limit, other processes, steal, the job's own threads)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from stallwatch.analyze.contention import own_waits, runq_column
from stallwatch.analyze.rules.contention import CPUContention
from stallwatch.analyze.rules.input_bound import InputBound
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.rules.step_outlier import StepOutlier
from stallwatch.records import DATA_WAIT, FORWARD, STEP, TRAIN

from ._fw_gen import MS, S, T0, FwGen, evaluate, node_info, random_chunks, run_info, snapshots, whole

SLOW = list(range(30, 400, 30))  # 13 steps


def _loop(runq_slow_us: int, *, n: int = 400, runq_us: int = 0) -> FwGen:
    """10 ms steps waiting 0.1 ms for data; the SLOW steps wait 200 ms more, of which `runq_slow_us` the training
    thread was waiting for a CPU; every other step waited `runq_us` for one."""
    gen = FwGen()
    starts = T0 + np.arange(n, dtype=np.int64) * 300 * MS
    for i, t in enumerate(starts.tolist()):
        slow = i in SLOW
        wait = (200_100 if slow else 100)
        dur = 10 * MS + (wait - 100)
        runq = runq_slow_us if slow else runq_us
        gen.events("algo-1", 0, STEP, "train_step", TRAIN, i, t, t + dur, f'{{"runq_us": {runq}}}' if runq else "")
        gen.events("algo-1", 0, DATA_WAIT, "next_batch", TRAIN, i, t, t + wait)
        gen.events("algo-1", 0, FORWARD, "Net", TRAIN, i, t + wait, t + dur)
    gen.dataloader(num_workers=0)
    return gen


def test_runq_is_read_from_the_steps_args_and_nothing_else():
    table = pa.table({"node": ["a"] * 5, "rank": [0] * 5, "kind": [STEP, STEP, STEP, FORWARD, STEP],
                      "mode": [TRAIN] * 5, "step": [0, 1, 2, 2, 3], "start_us": [0] * 5, "end_us": [10] * 5,
                      "args": ['{"runq_us": 7}', '{"runq_us":12}', "", '{"runq_us": 5}',
                               '{"runq_us": 9' + "9" * 30 + "}"]})
    assert runq_column(FrameworkColumns(table)).tolist() == [7, 12, 0, 0, 0]  # 31 digits: not a number it reads


def test_own_waits_spread_the_delay_for_shares_and_take_it_all_for_stalls():
    own, share_wait, floor = own_waits(np.array([100, 100]), np.array([50, 5]), np.array([40, 40]))
    assert own.tolist() == [60, 60] and share_wait.tolist() == [30, 3] and floor.tolist() == [10, 0]


def test_a_wait_for_a_cpu_is_not_a_data_stall():
    """The same 13 long waits: slow reads (no run-queue delay) are stalls named by step; waits for a CPU are not."""
    reads = evaluate(InputBound, whole(_loop(0).table()))["Details"]["ranks"]["algo-1/0/TRAIN"]
    assert reads["cause"] == "stalls" and reads["stall_steps"] == SLOW
    preempted = evaluate(InputBound, whole(_loop(200 * MS).table()))["Details"]["ranks"]["algo-1/0/TRAIN"]
    assert preempted["stalls"] == 0 and "stall_steps" not in preempted and not preempted["triggered"], preempted


def test_slow_steps_that_waited_for_a_cpu_are_not_outliers():
    assert evaluate(StepOutlier, whole(_loop(0).table()))["RuleTriggered"] == 1
    assert evaluate(StepOutlier, whole(_loop(200 * MS).table()))["RuleTriggered"] == 0


def _node(**series) -> dict:
    info = node_info(cores=2)
    info["cpu_competitors"] = [{"pid": 42, "name": "hog", "cpu_s": 12.0}]
    return {"algo-1": snapshots("algo-1", T0, T0 + 20 * S, interval_us=S // 2, info=info, **series)}, \
        run_info(info)


def test_a_cgroup_cpu_limit_is_named_with_its_throttling():
    system, run = _node(cpu__cpu_util=60.0, proc__cpu_util=55.0, cpu__load1=1.5, cgroup__cpu_throttled=4.0,
                        cgroup__cpu_throttled_s=0.2, cgroup__cpu_quota_cores=0.5, cpu__cpu_steal=0.0)
    out = evaluate(CPUContention, whole(_loop(0, runq_us=5 * MS).table(), system, run))
    d = out["Details"]
    assert out["RuleTriggered"] == 1 and d["cause"] == "cpu_limit", d
    node = d["nodes"]["algo-1"]
    assert node["throttled_periods"] == 160 and node["throttled_s"] == pytest.approx(8.0)
    assert node["quota_cores"] == 0.5 and "throttled it 160 times (8.0 s)" in d["title"]
    assert d["time_at_stake_s"] == pytest.approx(d["ranks"]["algo-1/0"]["runq_s"]) and "raise the limit" in \
        out["Recommendation"]


def test_other_processes_on_an_oversubscribed_node_are_named():
    system, run = _node(cpu__cpu_util=100.0, proc__cpu_util=45.0, cpu__load1=4.2, cpu__cpu_steal=0.0)
    out = evaluate(CPUContention, whole(_loop(0, runq_us=5 * MS).table(), system, run))
    d = out["Details"]
    assert d["cause"] == "oversubscribed" and "load 4.2 on 2 cores" in d["title"], d["title"]
    assert "hog (pid 42" in out["Recommendation"]


def test_steal_and_the_jobs_own_threads():
    system, run = _node(cpu__cpu_util=100.0, proc__cpu_util=97.0, cpu__load1=1.9, cpu__cpu_steal=20.0)
    assert evaluate(CPUContention, whole(_loop(0, runq_us=5 * MS).table(), system, run))["Details"]["cause"] == "steal"
    system, run = _node(cpu__cpu_util=100.0, proc__cpu_util=97.0, cpu__load1=6.0, cpu__cpu_steal=0.0)
    out = evaluate(CPUContention, whole(_loop(0, runq_us=5 * MS).table(), system, run))
    assert out["Details"]["cause"] == "own_threads" and "torch.set_num_threads" in out["Recommendation"]


def test_silent_below_the_threshold_and_not_applicable_without_readings():
    assert evaluate(CPUContention, whole(_loop(0, runq_us=200).table()))["RuleTriggered"] == 0
    out = evaluate(CPUContention, whole(_loop(0).table()))
    assert out["RuleTriggered"] == 0 and "run-queue delay" in out["Message"]


def test_one_chunk_or_many():
    system, run = _node(cpu__cpu_util=100.0, proc__cpu_util=45.0, cpu__load1=4.2, cpu__cpu_steal=0.0)
    chunk = whole(_loop(0, runq_us=5 * MS).table(), system, run)
    one = evaluate(CPUContention, chunk)
    many = evaluate(CPUContention, random_chunks(chunk, 7, seed=3))
    assert one["Details"] == many["Details"]
