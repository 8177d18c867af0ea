"""Hang on generated framework events and snapshots (the store's own formats) with planted stops: ranks that stop
while the sampler's snapshots go on are found, the one behind named (from its stacks, else its step count); a
stall that ended is a finding of its own; slow steps that keep coming (30 s each, at the defaults) never are; a
trailing quiet after a job that exited 0 is no hang; fed in one chunk or many, the same result."""

from __future__ import annotations

import dataclasses

from stallwatch.analyze.rules.base import Chunk
from stallwatch.analyze.rules.hang import Hang, HangDetails
from stallwatch.analyze.stack_phase import COLLECTIVE, DATA, LOOP_CODE, phase_of
from stallwatch.store.stacks import Frame, StackDump, ThreadStack

from ._fw_gen import MINUTE, MS, T0, FwGen, S, assert_chunk_invariant, evaluate, node_info, run_info, snapshots, whole

TORCH = "/usr/lib/python3/site-packages/torch"


def _dump(rank: int, at_us: int, *inner: Frame) -> StackDump:
    frames = [Frame("/job/train.py", 40, "<module>", "for step, batch in enumerate(loader):"), *inner]
    return StackDump("algo-1", rank, 1000 + rank, 1, at_us, [ThreadStack("MainThread", True, False, frames)],
                     path=f"stacks/algo-1/{rank}/000001-{1000 + rank}.json")


IN_ALL_REDUCE = (Frame("/job/train.py", 52, "<module>", "dist.all_reduce(loss)"),
                 Frame(f"{TORCH}/distributed/distributed_c10d.py", 3252, "all_reduce", "work.wait()"))
ASLEEP = (Frame("/job/train.py", 50, "<module>", "time.sleep(3600)"),)


def _stopped_job(*, exit_code: int | None = 143, stacks: list[StackDump] | None = None) -> Chunk:
    """Two ranks of 100 ms steps; rank 1 stops after step 149, rank 0 after step 150 (it then waits for rank 1);
    the sampler goes on for 5 minutes."""
    gen = FwGen()
    gen.steps(rank=0, n=151, step_us=100 * MS)
    gen.steps(rank=1, n=150, step_us=100 * MS)
    end = T0 + 20 * S + 5 * MINUTE
    node = {**node_info(end_us=end), "exit_code": exit_code}
    run = {**run_info(node), "stacks": stacks or []}
    return whole(gen.table(), {"algo-1": snapshots("algo-1", T0, end, 500 * MS)}, run)


def _details(out: dict) -> HangDetails:
    return HangDetails.from_json(out["Details"])


def test_ranks_that_stop_while_the_sampler_goes_on_are_found_and_the_one_behind_named():
    out = assert_chunk_invariant(Hang, _stopped_job())
    d = _details(out)
    assert out["RuleTriggered"] == 2 and d.stopped == ["algo-1/0", "algo-1/1"]
    assert d.behind == ["algo-1/1"] and "after an earlier step (149)" in d.behind_reason  # no stacks: by its step
    assert d.ranks["algo-1/1"].limit_s == 40.0  # the floor: 10 × 0.1 s is less
    assert d.ranks["algo-1/1"].idle_s > 290 and d.stacks_wanted == ["algo-1/0", "algo-1/1"]


def test_stacks_name_the_rank_that_never_reached_the_collective():
    at = T0 + 200 * S
    out = assert_chunk_invariant(Hang, _stopped_job(stacks=[_dump(0, at, *IN_ALL_REDUCE), _dump(1, at, *ASLEEP)]))
    d = _details(out)
    assert d.behind == ["algo-1/1"] and d.waiting_in == "all_reduce" and d.stacks_wanted == []
    assert (d.ranks["algo-1/0"].phase, d.ranks["algo-1/1"].phase) == (COLLECTIVE, LOOP_CODE)
    assert d.ranks["algo-1/1"].where == "/job/train.py:50 in <module>"
    assert d.ranks["algo-1/1"].stacks == ["stacks/algo-1/1/000001-1001.json"]
    assert d.title == "The job hung: rank 1 never reached all_reduce, where rank 0 waits (no progress for 5m 05s)"


def test_stacks_from_before_the_stop_are_not_its_stacks():
    out = evaluate(Hang, _stopped_job(stacks=[_dump(0, T0, *IN_ALL_REDUCE)]))
    assert _details(out).ranks["algo-1/0"].stacks == [] and "algo-1/0" in _details(out).stacks_wanted


def test_a_stall_that_ended_is_found_and_slow_steps_are_not():
    gen = FwGen()
    gen.steps(rank=0, n=100, step_us=100 * MS, slow={50: 4 * MINUTE})  # one step of 4 minutes, then on
    gen.steps(rank=1, n=20, step_us=30 * S, jitter_us=2 * S)  # 30 s steps: slow, never stopped
    last = T0 + 12 * MINUTE
    node = {**node_info(end_us=last), "exit_code": 0}
    chunk = whole(gen.table(), {"algo-1": snapshots("algo-1", T0, last, S)}, run_info(node))
    out = assert_chunk_invariant(Hang, chunk)
    d = _details(out)
    assert out["RuleTriggered"] == 1 and d.stopped == []
    (stall,) = d.stalls
    assert (stall.rank, stall.until_us is not None, round(stall.seconds)) == (0, True, 240)
    assert abs(d.ranks["algo-1/1"].limit_s - 300.0) < 10 and not d.ranks["algo-1/1"].stopped  # 10 × 30 s
    assert d.title is not None and d.title.endswith("on rank 0, then went on")


def test_quiet_after_a_job_that_exited_0_is_no_hang():
    out = evaluate(Hang, _stopped_job(exit_code=0))
    assert out["RuleTriggered"] == 0 and _details(out).stopped == []


def test_live_waits_a_flush_interval_before_calling_a_rank_stopped():
    """Running: the rank's last step may still be on its way to the store; the margin is the flush interval."""
    gen = FwGen()
    gen.steps(rank=0, n=10, step_us=100 * MS)
    last_end = T0 + 10 * 101 * MS
    run = {**run_info(node_info()), "config": {"flush_interval_s": 5.0}}
    for idle_s, stopped in ((44, False), (48, True)):  # the limit is 40 s, the margin 5 + 1.5 s
        chunk = Chunk({"algo-1": snapshots("algo-1", T0, last_end + idle_s * S + 1, S)}, gen.table(), run)
        assert _details(evaluate(Hang, chunk)).ranks["algo-1/0"].stopped is stopped, idle_s
        final = dataclasses.replace(chunk, final=True)
        assert _details(evaluate(Hang, final)).ranks["algo-1/0"].stopped  # at the end, no margin


def test_phases_from_stacks():
    assert phase_of(_dump(0, T0, *IN_ALL_REDUCE)).words == ("inside all_reduce (called at /job/train.py:52 in "
                                                             "<module>)")
    data = (Frame(f"{TORCH}/utils/data/dataloader.py", 630, "__next__", "data = self._next_data()"),)
    assert phase_of(_dump(0, T0, *data)).kind == DATA
    assert phase_of(None).kind == "unknown"


def test_a_rank_that_stops_while_the_others_go_on_is_the_one_named():
    gen = FwGen()
    gen.steps(rank=0, n=3000, step_us=100 * MS)  # 5 minutes of steps, to the end
    gen.steps(rank=1, n=150, step_us=100 * MS)
    end = T0 + 5 * MINUTE + 10 * S
    chunk = whole(gen.table(), {"algo-1": snapshots("algo-1", T0, end, S)},
                  run_info({**node_info(end_us=end), "exit_code": 137}))
    d = _details(assert_chunk_invariant(Hang, chunk))
    assert d.stopped == d.behind == ["algo-1/1"] and d.behind_reason == "rank 0 goes on"
    assert d.title is not None and d.title.startswith("Rank 1 made no progress for 4m") and d.title.endswith("go on")
