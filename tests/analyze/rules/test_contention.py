"""CPU contention on generated events: steps that record their training thread's run-queue delay (`runq_us`).
Stalls and slow steps explained by it are not InputBound's or StepOutlier's; CPUContention names it with the cause
the node's snapshots show (a cgroup CPU limit, other processes, steal, the job's own threads)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from stallwatch.analyze.contention import own_waits, peer_runq, runq_column, wait_runq
from stallwatch.analyze.rules.contention import CPUContention
from stallwatch.analyze.rules.input_bound import InputBound
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.rules.step_outlier import StepOutlier
from stallwatch.records import DATA_WAIT, FORWARD, STEP, TRAIN, UNTIMED

from ._fw_gen import MS, S, T0, FwGen, evaluate, node_info, random_chunks, run_info, snapshots, whole

SLOW = list(range(30, 400, 30))  # 13 steps


def _loop(runq_slow_us: int, *, n: int = 400, runq_us: int = 0, in_wait: int | None = None) -> FwGen:
    """10 ms steps waiting 0.1 ms for data; the SLOW steps wait 200 ms more, of which `runq_slow_us` the training
    thread was waiting for a CPU; every other step waited `runq_us` for one. With `in_wait`, each step also says
    how much of its delay fell in its wait (as the hooks record it)."""
    gen = FwGen()
    starts = T0 + np.arange(n, dtype=np.int64) * 300 * MS
    for i, t in enumerate(starts.tolist()):
        slow = i in SLOW
        wait = (200_100 if slow else 100)
        dur = 10 * MS + (wait - 100)
        runq = runq_slow_us if slow else runq_us
        args = f'{{"runq_us": {runq}}}' if runq else ""
        if in_wait is not None:
            args = f'{{"runq_us": {runq}, "wait_runq_us": {min(in_wait, runq)}}}'
        gen.events("algo-1", 0, STEP, "train_step", TRAIN, i, t, t + dur, args)
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


def test_the_delay_measured_in_the_wait_is_taken_from_the_wait_alone():
    """A step of 100 whose 40 of delay fell outside its 50 of sleeping read: the wait stays 50 (spread, it read 30),
    and a measured 0 is told from a step that never said (-1)."""
    own, share_wait, floor = own_waits(np.array([100, 100, 100]), np.array([50, 50, 50]), np.array([40, 40, 40]),
                                       np.array([0, 30, -1]))
    assert own.tolist() == [60, 60, 60] and share_wait.tolist() == [50, 20, 30] and floor.tolist() == [50, 20, 10]
    table = pa.table({"node": ["a"] * 3, "rank": [0] * 3, "kind": [STEP] * 3, "mode": [TRAIN] * 3, "step": [0, 1, 2],
                      "start_us": [0] * 3, "end_us": [10] * 3,
                      "args": ['{"runq_us": 7, "wait_runq_us": 0}', '{"runq_us": 7}', '{"wait_runq_us": 3}']})
    cols = FrameworkColumns(table)
    assert wait_runq(cols, np.arange(3)).tolist() == [0, -1, 3] and runq_column(cols).tolist() == [7, 7, 0]


def test_sleeping_reads_on_a_busy_machine_stay_data_waits():
    """Each step sleeps 20 ms in its read (2 ms more waking up on a busy CPU), computes 5 ms and waits 100 ms for a
    CPU outside its read: spread over the step the read shrank to 4 ms (17 %: silent, as a Keras PyDataset read
    at load 10); measured where it fell, the read is 80 % of the step's own time."""
    def loop(measured: bool) -> FwGen:
        gen = FwGen()
        for i in range(300):
            t = T0 + i * 200 * MS
            wait, dur, runq = 22 * MS, 127 * MS, 102 * MS
            args = f'{{"runq_us": {runq}, "wait_runq_us": {2 * MS}}}' if measured else f'{{"runq_us": {runq}}}'
            gen.events("algo-1", 0, STEP, "train_step", TRAIN, i, t, t + dur, args)
            gen.events("algo-1", 0, DATA_WAIT, "next_batch", TRAIN, i, t, t + wait)
            gen.events("algo-1", 0, FORWARD, "Net", TRAIN, i, t + wait, t + dur)
        gen.dataloader(num_workers=0)
        return gen

    spread = evaluate(InputBound, whole(loop(False).table()))["Details"]["ranks"]["algo-1/0/TRAIN"]
    exact = evaluate(InputBound, whole(loop(True).table()))["Details"]["ranks"]["algo-1/0/TRAIN"]
    assert not spread["triggered"] and spread["wait_share"] < 20, spread
    assert exact["triggered"] and exact["cause"] == "main_process" and exact["wait_share"] == pytest.approx(80), exact


def test_a_wait_for_a_cpu_is_not_a_data_stall():
    """The same 13 long waits: slow reads (no run-queue delay) are stalls named by step; waits for a CPU are not."""
    reads = evaluate(InputBound, whole(_loop(0).table()))["Details"]["ranks"]["algo-1/0/TRAIN"]
    assert reads["cause"] == "stalls" and reads["stall_steps"] == SLOW
    preempted = evaluate(InputBound, whole(_loop(200 * MS).table()))["Details"]["ranks"]["algo-1/0/TRAIN"]
    assert preempted["stalls"] == 0 and "stall_steps" not in preempted and not preempted["triggered"], preempted


def test_slow_steps_that_waited_for_a_cpu_are_not_outliers():
    assert evaluate(StepOutlier, whole(_loop(0).table()))["RuleTriggered"] == 1
    assert evaluate(StepOutlier, whole(_loop(200 * MS).table()))["RuleTriggered"] == 0


def _held_at_a_barrier(peer_us: int) -> FwGen:
    """400 steps of 10 ms (±0.5 ms), 13 of them 30 ms: the training thread never waited for a CPU, its native peer
    waited `peer_us` in each slow step (and 5 ms in every fifth normal one)."""
    gen = FwGen()
    rng = np.random.default_rng(0)
    for i in range(400):
        t = T0 + i * 40 * MS
        dur = 30 * MS if i in SLOW else 10 * MS + int(rng.integers(-500, 501))
        peer = peer_us if i in SLOW else 5 * MS if i % 5 == 0 else 0
        gen.events("algo-1", 0, STEP, "train_step", TRAIN, i, t, t + dur, f'{{"peer_runq_us": {peer}}}' if peer else "")
        gen.events("algo-1", 0, FORWARD, "Net", TRAIN, i, t, t + dur)
    return gen


def test_slow_steps_held_at_a_barrier_by_a_peer_waiting_for_a_cpu_are_not_outliers():
    """A step over the threshold only by the time its intra-op peers waited for a CPU is excused and counted as
    such; a step slower than that is still an outlier, and the normal steps' spread is their own."""
    def entry(peer_us: int) -> dict:
        return evaluate(StepOutlier, whole(_held_at_a_barrier(peer_us).table()))["Details"]["step_details"][
            "algo-1/0/TRAIN"]

    alone = entry(0)
    assert alone["triggered"] and alone["number_of_outliers"] == 13 and alone["outliers_waiting_for_cpu"] == 0
    held = entry(25 * MS)
    assert not held["triggered"] and held["number_of_outliers"] == 0 and held["outliers_waiting_for_cpu"] == 13, held
    assert held["outlier_threshold"] == alone["outlier_threshold"]  # judged on the same own times
    short = entry(5 * MS)  # 25 ms over the median, 5 of it explained: still slow steps of the job's making
    assert short["triggered"] and short["number_of_outliers"] == 13 and short["outliers_waiting_for_cpu"] == 0


def test_the_peers_delay_is_read_from_the_steps_args_and_capped_at_the_step():
    table = pa.table({"node": ["a"] * 4, "rank": [0] * 4, "kind": [STEP, STEP, FORWARD, STEP], "mode": [TRAIN] * 4,
                      "step": [0, 1, 1, 2], "start_us": [0] * 4, "end_us": [10, 10, 10, 10],
                      "args": ['{"runq_us": 3, "peer_runq_us": 4}', '{"peer_runq_us": 40}', '{"peer_runq_us": 5}',
                               '{"runq_us": 3}']})
    cols = FrameworkColumns(table)
    assert peer_runq(cols, np.arange(4)).tolist() == [4, 10, 0, 0] and runq_column(cols).tolist() == [3, 0, 0, 3]


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


def test_steps_measured_at_no_delay_read_as_measured_not_as_missing():
    """On an idle machine no step waits for a CPU: the hooks say the first step's 0 once (torch/steps.py), and the
    rule is applicable and silent, not "the steps do not record the delay"."""
    table = _loop(0).table()
    args = table["args"].to_pylist()
    first = table["kind"].to_pylist().index(STEP)
    args[first] = '{"runq_us": 0}'
    out = evaluate(CPUContention, whole(table.set_column(table.schema.get_field_index("args"), "args",
                                                         pa.array(args, table.schema.field("args").type))))
    assert out["RuleTriggered"] == 0 and out["Datapoints"] == 400
    assert "do not record" not in (out.get("Message") or ""), out


def test_one_chunk_or_many():
    system, run = _node(cpu__cpu_util=100.0, proc__cpu_util=45.0, cpu__load1=4.2, cpu__cpu_steal=0.0)
    chunk = whole(_loop(0, runq_us=5 * MS).table(), system, run)
    one = evaluate(CPUContention, chunk)
    many = evaluate(CPUContention, random_chunks(chunk, 7, seed=3))
    assert one["Details"] == many["Details"]


def test_a_sampled_rank_is_judged_over_all_its_steps():
    """A fast loop times steps 10 ms a second: 100 timed steps of 1 ms, half of it waiting for a CPU (0.05 s, under
    `min_s`), beside 10 s of steps counted, not timed — the wait over all steps is 0.5 s and more: it fires."""
    def loop(counted_s: int) -> FwGen:
        gen = FwGen()
        for i in range(100):
            t = T0 + i * MS
            gen.events("algo-1", 0, STEP, "train_step", TRAIN, i, t, t + MS, '{"runq_us": 500}')
        if counted_s:
            gen.events("algo-1", 0, UNTIMED, "untimed", TRAIN, None, T0 + S, T0 + (1 + counted_s) * S, "")
        return gen

    alone = evaluate(CPUContention, whole(loop(0).table()))
    sampled = evaluate(CPUContention, whole(loop(10).table()))
    assert alone["RuleTriggered"] == 0 and sampled["RuleTriggered"] == 1, (alone["Details"], sampled["Details"])


def _fed_loop(n: int = 400) -> FwGen:
    """20 ms steps, each waiting 6 ms for its batch from a loader with 2 workers: 30 % of the time."""
    gen = FwGen()
    for i in range(n):
        t = T0 + i * 20 * MS
        gen.events("algo-1", 0, STEP, "train_step", TRAIN, i, t, t + 20 * MS)
        gen.events("algo-1", 0, DATA_WAIT, "next_batch", TRAIN, i, t, t + 6 * MS)
        gen.events("algo-1", 0, FORWARD, "Net", TRAIN, i, t + 6 * MS, t + 20 * MS)
    gen.dataloader(num_workers=2)
    return gen


def test_workers_kept_from_a_cpu_by_other_processes_are_not_a_data_wait():
    """The 2 workers waited 600 ms a second for a CPU. With other processes holding 60 % of the busy node, each
    worker lost 180 ms a second to them: 3.6 ms of each 20 ms step was theirs, and the loop waits 2.4 of 16.4 ms,
    15 % (silent), as it would on an idle machine. The job's own threads holding the cores (97 % of it the
    job's), or workers that never waited for a CPU, leave the wait as it is: 30 %, input-bound."""
    def judged(**series) -> dict:
        system, run = _node(cpu__cpu_util=100.0, proc__workers_alive=2.0, **series)
        chunk = whole(_fed_loop().table(), system, run)
        out = evaluate(InputBound, chunk)
        assert out == evaluate(InputBound, random_chunks(chunk, 7, seed=5))  # live or at once, the same
        return out["Details"]["ranks"]["algo-1/0/TRAIN"]

    others = judged(proc__cpu_util=40.0, proc__workers_runq_ms_per_s=600.0)
    assert not others["triggered"] and others["wait_share"] == pytest.approx(100 * 2.4 / 16.4), others
    own = judged(proc__cpu_util=97.0, proc__workers_runq_ms_per_s=600.0)
    assert own["triggered"] and own["wait_share"] == pytest.approx(100 * 5.82 / 19.82), own
    never = judged(proc__cpu_util=40.0, proc__workers_runq_ms_per_s=0.0)
    assert never["triggered"] and never["wait_share"] == pytest.approx(30.0), never
    unknown = judged(proc__cpu_util=40.0)  # a run recorded before the workers' delay was
    assert unknown["triggered"] and unknown["wait_share"] == pytest.approx(30.0), unknown
