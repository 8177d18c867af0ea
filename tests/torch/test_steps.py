"""The step tracker on its own: exactly one step per batch, modes from what happened inside, explicit marks
taking over, the optimizer fallback. Times come from the real clock; the order of calls is the contract."""

from __future__ import annotations

import json

import pytest

from stallwatch.records import BACKWARD, DATA_WAIT, EVAL, FORWARD, GLOBAL, LOOP, OPTIMIZER, STEP, TRAIN, UNTIMED
from stallwatch.torch.steps import MAX_UNDECIDED_ITERATIONS, StepTracker, expand, now_us


class Listener:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_step_begin(self, mode, step, now_us):
        self.calls.append(("begin", mode, step))

    def on_step_end(self, mode, step, start_us, end_us):
        self.calls.append(("end", mode, step))


class Events(list):
    """What the tracker emits, step records expanded into their events (as the sampler stores them)."""

    def append(self, record):
        self.extend(expand(record))


_made: list[StepTracker] = []


@pytest.fixture(autouse=True)
def _close_trackers():
    """Each tracker keeps its thread's /proc files open once read: given back after each test."""
    yield
    while _made:
        _made.pop().close()


def _tracker():
    events = Events()
    listener = Listener()
    _made.append(StepTracker(events.append, pid=7, listener=listener))
    return _made[-1], events, listener


def _train_batch(t: StepTracker, loader: int = 1) -> None:
    t0 = t.batch_begin(loader, grad_enabled=True)
    t.batch_end(loader, t0, exhausted=False)
    t1, t2, t3, t4 = (now_us() for _ in range(4))  # phases, in order, on the real clock
    t.forward(t1, t2, "Net", grad_enabled=True)
    t.backward(t2, t3)
    t.optimizer(t3, t4, "SGD")


def _eval_batch(t: StepTracker, loader: int = 2) -> None:
    t0 = t.batch_begin(loader, grad_enabled=False)
    t.batch_end(loader, t0, exhausted=False)
    t.forward(now_us(), now_us(), "Net", grad_enabled=False)


def _end_of(t: StepTracker, loader: int) -> None:
    t0 = t.batch_begin(loader, grad_enabled=True)
    t.batch_end(loader, t0, exhausted=True)


def steps(events):
    return [(e[4], e[5]) for e in events if e[0] == STEP]


def markers(events):
    """How the loop's steps were delimited, in the order the tracker decided."""
    return [e[1] for e in events if e[0] == LOOP]


def _pair(t: StepTracker, at: int, grad: bool = True) -> None:
    t.forward(at, at + 10, "Net", grad)
    t.backward(at + 10, at + 20)


def test_a_train_loop_and_an_eval_loop_give_one_step_per_batch_with_its_phases():
    t, events, listener = _tracker()
    for epoch in range(2):
        for _ in range(3):
            _train_batch(t)
        _end_of(t, 1)
        for _ in range(2):
            _eval_batch(t)
        _end_of(t, 2)
    t.finish()
    assert steps(events) == [(TRAIN, 0), (TRAIN, 1), (TRAIN, 2), (EVAL, 0), (EVAL, 1),
                             (TRAIN, 3), (TRAIN, 4), (TRAIN, 5), (EVAL, 2), (EVAL, 3)]
    train3 = [e for e in events if e[4] == TRAIN and e[5] == 3]
    assert sorted(e[0] for e in train3) == sorted([STEP, DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER])
    step = next(e for e in train3 if e[0] == STEP)
    assert all(step[2] <= e[2] and e[3] <= step[3] for e in train3)  # phases inside their step
    assert all(e[6] == 7 for e in events)
    # Windows are told before each step (the eval loop predicted from grad mode) and after it.
    assert listener.calls[:2] == [("begin", TRAIN, 0), ("end", TRAIN, 0)]
    assert ("begin", EVAL, 0) in listener.calls


def test_a_step_ends_when_the_next_batch_is_asked_for_and_the_last_at_the_empty_request():
    t, events, _ = _tracker()
    _train_batch(t)
    _train_batch(t)
    _end_of(t, 1)
    s = [e for e in events if e[0] == STEP]
    waits = [e for e in events if e[0] == DATA_WAIT]
    assert s[0][3] == s[1][2]  # step 0 ends where the request for batch 1 began, and step 1 begins there
    # its wait for the batch begins after stallwatch's own bookkeeping at that boundary, which is not data loading
    assert s[1][2] <= waits[1][2] <= waits[1][3] <= s[1][3]
    assert len(s) == 2


def test_two_loaders_zipped_are_one_step_not_two():
    t, events, _ = _tracker()
    for _ in range(3):
        a = t.batch_begin(1, True)
        t.batch_end(1, a, False)
        b = t.batch_begin(2, True)
        t.batch_end(2, b, False)
        t.forward(b, b + 5, "Net", True)
        t.backward(b + 5, b + 6)
    t.finish()
    assert steps(events) == [(TRAIN, 0), (TRAIN, 1), (TRAIN, 2)]
    assert sum(e[0] == DATA_WAIT for e in events) == 6


def test_a_loop_with_nothing_recognisable_gives_global_steps():
    t, events, _ = _tracker()
    for _ in range(2):
        x = t.batch_begin(1, True)
        t.batch_end(1, x, False)
    _end_of(t, 1)
    t.finish()
    assert steps(events) == []  # batches fetched but no work: nothing to call a step, nothing invented


def test_without_a_data_loader_a_step_runs_from_its_first_call_to_the_next_iterations(caplog):
    """On a GPU, `loss.item()` after `optimizer.step()` waits for the step's kernels: measured on an H100, steps
    that ended at optimizer.step() read 4.8 ms for 67.5 ms iterations, the rest "between steps"."""
    t, events, _ = _tracker()
    for i in range(3):
        t.forward(100 * i, 100 * i + 10, "Net", True)
        t.backward(100 * i + 10, 100 * i + 20)
        t.optimizer(100 * i + 20, 100 * i + 30, "Adam")
    t.forward(500, 510, "Net", False)  # an evaluation under no_grad without a DataLoader: an EVAL step
    t.forward(600, 610, "Net", True)
    t.optimizer(620, 630, "Adam")
    t.finish()
    assert steps(events) == [(TRAIN, 0), (TRAIN, 1), (TRAIN, 2), (EVAL, 0), (TRAIN, 3)]
    assert [e[2:4] for e in events if e[0] == STEP] == [(0, 100), (100, 200), (200, 500), (500, 510), (600, 630)]
    assert (FORWARD, "Net", 500, 510, EVAL, 0, 7, "") in events
    assert markers(events) == ["optimizer"]


def test_a_collective_inside_the_next_forward_belongs_to_the_next_step():
    """FSDP gathers parameters inside the forward: the collective is reported before the forward that holds it."""
    t, events, _ = _tracker()
    t.forward(0, 10, "Net", True)
    t.backward(10, 20)
    t.optimizer(20, 30, "Adam")
    t.other("collective", "all_gather_into_tensor", 105, 108)
    t.forward(100, 110, "Net", True)
    t.backward(110, 120)
    t.optimizer(120, 130, "Adam")
    t.finish()
    assert [e[2:4] for e in events if e[0] == STEP] == [(0, 100), (100, 130)]
    assert ("collective", "all_gather_into_tensor", 105, 108, TRAIN, 1, 7, "") in events


def test_explicit_marks_take_over_and_keep_the_batch_fetched_before_the_mark():
    t, events, _ = _tracker()
    _train_batch(t)  # automatic first
    for _ in range(2):
        w = t.batch_begin(1, True)
        t.batch_end(1, w, False)
        t.begin_step(TRAIN)
        t.forward(w + 1, w + 2, "Net", True)
        t.backward(w + 2, w + 3)
    t.begin_step(EVAL)
    t.end_step()
    t.finish()
    assert steps(events) == [(TRAIN, 0), (TRAIN, 1), (TRAIN, 2), (EVAL, 0)]
    explicit = [e for e in events if e[5] == 1 and e[4] == TRAIN]
    wait = next(e for e in explicit if e[0] == DATA_WAIT)
    step = next(e for e in explicit if e[0] == STEP)
    assert step[2] == wait[2]  # the step starts where its batch was asked for


def test_explicit_marker_style_puts_the_next_batch_in_the_next_step():
    t, events, _ = _tracker()
    waits = []
    for _ in range(3):
        w = t.batch_begin(1, True)
        t.batch_end(1, w, False)
        waits.append(w)
        t.begin_step(None)  # `prof.step()` at the top of the loop body, mode from what happens
        t.forward(w + 1, w + 2, "Net", False)
    t.end_step()
    assert steps(events) == [(EVAL, 0), (EVAL, 1), (EVAL, 2)]
    starts = [e[2] for e in events if e[0] == STEP]
    assert starts == waits


def test_unfinished_step_at_exit_ends_at_its_last_phase_and_keeps_its_loops_mode():
    """A training step cut short by a signal in its forward read as an EVAL step (no backward reached)."""
    t, events, _ = _tracker()
    t0 = t.batch_begin(1, True)
    t.batch_end(1, t0, False)
    t.forward(t0, t0 + 10, "Net", True)
    t.finish()
    (step,) = [e for e in events if e[0] == STEP]
    assert step[3] == t0 + 10 and step[4] == TRAIN
    t, events, _ = _tracker()
    _train_batch(t)
    t0 = t.batch_begin(1, True)
    t.batch_end(1, t0, False)
    t.forward(t0, t0 + 10, "Net", True)  # interrupted here
    t.finish()
    assert steps(events) == [(TRAIN, 0), (TRAIN, 1)]
    t, events, _ = _tracker()
    t0 = t.batch_begin(2, False)  # an evaluation loop cut short stays an evaluation
    t.batch_end(2, t0, False)
    t.forward(t0, t0 + 10, "Net", False)
    t.finish()
    assert steps(events) == [(EVAL, 0)]


def test_phases_outside_any_step_are_recorded_without_a_step_number():
    t, events, _ = _tracker()
    _train_batch(t)
    _end_of(t, 1)
    t.forward(1, 2, "Net", True)  # e.g. a forward after the loop, for a sample prediction
    assert (FORWARD, "Net", 1, 2, TRAIN, None, 7, "") in events
    assert GLOBAL not in {e[4] for e in events if e[0] == STEP}


# -- loops without a DataLoader ----------------------------------------------------------------------------

def test_a_manual_update_loop_is_one_step_per_forward_backward_pair():
    """Manual SGD (`p.data.add_(p.grad, alpha=-lr)`, no optimizer.step()) collapsed into one step."""
    t, events, listener = _tracker()
    for i in range(5):
        _pair(t, 100 * i)
    t.finish()
    assert steps(events) == [(TRAIN, i) for i in range(5)]
    assert [e[2:4] for e in events if e[0] == STEP] == [(0, 100), (100, 200), (200, 300), (300, 400), (400, 420)]
    assert markers(events) == ["pairs"]
    assert [c for c in listener.calls if c[0] == "end"] == [("end", TRAIN, i) for i in range(5)]


def test_more_pairs_than_are_held_undecided_still_count_exactly():
    t, events, _ = _tracker()
    n = MAX_UNDECIDED_ITERATIONS + 8
    for i in range(n):
        _pair(t, 100 * i)
    t.finish()
    assert steps(events) == [(TRAIN, i) for i in range(n)]
    assert sum(e[0] == FORWARD for e in events) == n and all(e[5] is not None for e in events if e[0] != LOOP)


def test_gradient_accumulation_without_a_data_loader_is_one_step_per_optimizer_step():
    t, events, _ = _tracker()
    for i in range(3):
        base = 1000 * i
        for k in range(4):
            _pair(t, base + 100 * k)
        t.optimizer_begin(base + 500)
        t.optimizer(base + 500, base + 510, "AdamW")
    t.finish()
    assert steps(events) == [(TRAIN, 0), (TRAIN, 1), (TRAIN, 2)]
    assert sum(e[0] == FORWARD and e[5] == 0 for e in events) == 4
    assert markers(events) == ["optimizer"]


def test_an_evaluation_pass_without_a_data_loader_is_one_eval_step_per_forward():
    """A periodic `estimate_loss()` over tensor slices under no_grad never became EVAL steps (0 of 280)."""
    t, events, _ = _tracker()
    at = 0
    for i in range(4):
        if i % 2 == 0:
            for _ in range(3):  # estimate_loss(): three batches under no_grad
                t.forward(at, at + 5, "GPT", False)
                at += 10
        _pair(t, at)
        at += 100
    t.finish()
    assert [s for s in steps(events) if s[0] == TRAIN] == [(TRAIN, i) for i in range(4)]
    assert [s for s in steps(events) if s[0] == EVAL] == [(EVAL, i) for i in range(6)]
    # the evaluation's forwards are not charged to training
    assert not [e for e in events if e[1] == "GPT" and e[4] != EVAL]


def test_an_lbfgs_closure_is_one_step_and_its_forward_backward_are_not_optimizer_time():
    """`optimizer.step(closure)` read "optimizer 100 %": the closure's forward/backward run inside it."""
    t, events, _ = _tracker()
    for i in range(2):
        base = 1000 * i
        t.optimizer_begin(base)
        for k in range(5):  # LBFGS evaluates the closure several times per step
            _pair(t, base + 10 + 100 * k)
        t.optimizer(base, base + 600, "LBFGS")
    t.finish()
    assert steps(events) == [(TRAIN, 0), (TRAIN, 1)]
    step0 = [e for e in events if e[5] == 0]
    optimizer_us = sum(e[3] - e[2] for e in step0 if e[0] == OPTIMIZER)
    inner_us = sum(e[3] - e[2] for e in step0 if e[0] in (FORWARD, BACKWARD))
    assert inner_us == 5 * 20 and optimizer_us == 600 - inner_us
    # contiguous: a step runs to the next one's start, the last ends at its update
    assert [e[2:4] for e in events if e[0] == STEP] == [(0, 1000), (1000, 1600)]


def test_a_closures_own_code_is_neither_optimizer_nor_a_phase():
    """Lightning's automatic optimization: `training_step` (forward, logging, backward) is the closure. The
    optimizer's phases are the time outside the closure; the closure's time outside forward and backward is in
    no phase (the loop's own code)."""
    t, events, _ = _tracker()
    t.begin_step(TRAIN)
    t.optimizer_begin(100)
    t.forward(120, 140, "Net", True)  # the closure runs 110..400: forward, 200 µs of logging, backward
    t.backward(340, 390)
    t.closure(110, 400)
    t.optimizer(100, 450, "SGD")
    t.end_step()
    t.finish()
    assert [e[2:4] for e in events if e[0] == OPTIMIZER] == [(100, 110), (400, 450)]
    assert t.counts[TRAIN] == 1


def test_forwards_without_backward_or_optimizer_say_the_loop_could_not_be_delimited():
    t, events, _ = _tracker()
    for i in range(4):
        t.forward(100 * i, 100 * i + 10, "Net", True)  # inference with autograd on, nothing else
    t.finish()
    assert len(steps(events)) == 1
    assert markers(events) == ["undetermined"]


def _iteration(t: StepTracker, at: int, *optimizers: int) -> None:
    """One iteration without a DataLoader: per optimizer, a forward, a backward and its update."""
    for k, who in enumerate(optimizers):
        base = at + 30 * k
        t.forward(base, base + 10, "Net", True)
        t.backward(base + 10, base + 20)
        t.optimizer_begin(base + 20, who)
        t.optimizer(base + 20, base + 30, "Adam", who)


def test_a_gan_without_a_data_loader_is_one_step_per_iteration_not_per_optimizer():
    """The discriminator's update, then the generator's: two optimizer steps, one iteration (was: two steps)."""
    t, events, _ = _tracker()
    for i in range(4):
        _iteration(t, 100 * i, 1, 2)
    t.finish()
    assert steps(events) == [(TRAIN, i) for i in range(4)]
    assert [e[2:4] for e in events if e[0] == STEP] == [(0, 100), (100, 200), (200, 300), (300, 360)]
    assert [sum(e[0] == OPTIMIZER and e[5] == i for e in events) for i in range(4)] == [2, 2, 2, 2]


def test_two_optimizers_stepped_back_to_back_are_one_step():
    """Muon beside AdamW (modded-nanoGPT): `opt1.step(); opt2.step()` after one backward."""
    t, events, _ = _tracker()
    for i in range(3):
        at = 100 * i
        t.forward(at, at + 10, "GPT", True)
        t.backward(at + 10, at + 20)
        for who in (1, 2):
            t.optimizer_begin(at + 20 + 5 * who, who)
            t.optimizer(at + 20 + 5 * who, at + 25 + 5 * who, "Muon" if who == 1 else "AdamW", who)
    t.finish()
    assert steps(events) == [(TRAIN, 0), (TRAIN, 1), (TRAIN, 2)]


def test_an_actor_updated_every_other_iteration_is_not_a_step_of_its_own():
    """TD3: the critic every iteration, the actor every second one: one step per iteration."""
    t, events, _ = _tracker()
    for i in range(4):
        _iteration(t, 100 * i, *((1, 2) if i % 2 else (1,)))
    t.finish()
    assert steps(events) == [(TRAIN, i) for i in range(4)]
    assert [e[2] for e in events if e[0] == STEP] == [0, 100, 200, 300]


def test_a_forward_after_the_last_update_is_a_step_of_its_own_at_exit():
    t, events, _ = _tracker()
    _iteration(t, 0, 1)
    _iteration(t, 100, 1)
    t.forward(200, 210, "Net", True)  # interrupted in the next iteration's forward
    t.finish()
    assert steps(events) == [(TRAIN, 0), (TRAIN, 1), (TRAIN, 2)]
    assert [e[2:4] for e in events if e[0] == STEP] == [(0, 100), (100, 200), (200, 210)]



# -- sampled steps: paused at a boundary, counted, resumed ---------------------------------------------------------
def _sampled_tracker(counted: dict[str, int]):
    t, events, _ = _tracker()
    t.listener = None  # nothing needs each step (a window, a new configuration): steps may be sampled
    paused: list[int] = []
    t.on_pause = paused.append
    t.count_paused = lambda: dict(counted)
    return t, events, paused


def test_a_paused_loader_loop_counts_its_steps_and_numbers_them_in_order():
    counted: dict[str, int] = {}
    t, events, paused = _sampled_tracker(counted)
    for _ in range(3):
        _train_batch(t)
    t.pause_after_us = now_us()
    t0 = t.batch_begin(1, grad_enabled=True)  # step 2 ends here, and timing pauses
    assert t.paused_at == t0 and paused == [t0] and not t.in_step
    t.batch_end(1, t0, exhausted=False)
    t.forward(now_us(), now_us(), "Net", grad_enabled=True)  # the hooks' last calls before they come off: ignored
    t.backward(now_us(), now_us())
    t.optimizer(now_us(), now_us(), "SGD")
    counted[TRAIN] = 5  # the loader handed out 5 batches while paused
    t.resume(now_us())
    for _ in range(2):
        _train_batch(t)
    t.finish()
    steps = [e for e in events if e[0] == STEP]
    assert [e[5] for e in steps] == [0, 1, 2, 8, 9]  # 3..7 were the counted ones
    assert all(e[5] is not None for e in events if e[0] in (FORWARD, BACKWARD, OPTIMIZER))
    untimed = [e for e in events if e[0] == UNTIMED]
    assert [(e[4], e[5], json.loads(e[7])) for e in untimed] == \
        [(TRAIN, None, {"steps": 5, "first": 3, "stretches": 1, "us": untimed[0][3] - t0})]
    assert untimed[0][2] == t0 and untimed[0][3] <= steps[3][2]
    assert t.counts[TRAIN] == 10


def test_explicit_marks_while_paused_are_counted_and_the_first_mark_after_the_hooks_return_resumes():
    t, events, _ = _sampled_tracker({})
    for _ in range(2):
        t.begin_step(TRAIN)
    t.pause_after_us = now_us()
    t.begin_step(TRAIN)  # step 1 ends; this one is counted
    assert t.paused_at is not None
    for _ in range(3):
        t.end_step()
        t.begin_step(TRAIN)
    t.begin_step(EVAL)
    t.rearmed = True  # the timer put the hooks back
    t.begin_step(TRAIN)
    t.end_step()
    t.finish()
    assert [(e[4], e[5]) for e in events if e[0] == STEP] == [(TRAIN, 0), (TRAIN, 1), (TRAIN, 6)]
    counted = {e[4]: json.loads(e[7])["steps"] for e in events if e[0] == UNTIMED}
    assert counted == {TRAIN: 4, EVAL: 1}


def _gan_iteration(t, paused: bool) -> None:
    """One iteration of a loop delimited by optimizer steps: the critic's update, then the model's. While paused the
    hooks are off the classes (no forward, backward) and the optimizer's hooks only count (`optimizer_counted`)."""
    for who, name in ((1, "critic"), (2, "model")):
        if paused and t.paused_at is not None:
            t.optimizer_counted(who)
            continue
        t.forward(now_us(), now_us(), name, grad_enabled=True)
        t.backward(now_us(), now_us())
        t.optimizer_begin(now_us(), who)
        if t.paused_at is not None:  # the pause began in this optimizer's step: its end is counted
            t.optimizer_counted(who)
            continue
        t.optimizer(now_us(), now_us(), "SGD", who)


def test_an_optimizer_delimited_loop_counts_its_first_optimizers_steps_and_resumes_on_an_iteration():
    """Paused at the first optimizer's step (inside torch's iteration of the optimizer hooks: they stay on), its steps
    are counted, the other optimizer's are not; once the hooks are back, the first optimizer's next step resumes, and
    the rest of that iteration (the model's update) is no step of its own: timed steps are whole iterations again."""
    t, events, paused = _sampled_tracker({})
    for _ in range(3):
        _gan_iteration(t, paused=False)
    t.pause_after_us = now_us()
    _gan_iteration(t, paused=True)  # the first optimizer's step closes iteration 2 and pauses: iteration 3 is counted
    assert t.paused_at is not None and paused
    for _ in range(4):  # iterations 4..7
        _gan_iteration(t, paused=True)
    t.rearmed = True
    _gan_iteration(t, paused=True)  # iteration 8: counted at the critic's step, which resumes; the model's is timed
    assert t.paused_at is None
    for _ in range(3):  # iterations 9..11
        _gan_iteration(t, paused=False)
    t.finish()
    steps = [e for e in events if e[0] == STEP]
    untimed = [json.loads(e[7]) for e in events if e[0] == UNTIMED]
    assert [u["steps"] for u in untimed] == [6] and untimed[0]["first"] == 3  # iterations 3..8
    assert [e[5] for e in steps] == [0, 1, 2, 9, 10, 11]
    forwards = [[e[1] for e in events if e[0] == FORWARD and e[5] == n] for n in (9, 10, 11)]
    assert forwards == [["critic", "model"]] * 3  # whole iterations, the critic's first
    assert t.counts[TRAIN] == 12


def _pair_iteration(t, paused: bool, evals: int = 0) -> None:
    """One iteration of a loop of forward/backward pairs (a manual update, no optimizer): the model's forward, a
    target under no_grad inside the step, backward; then `evals` forwards under no_grad. While paused (and the hooks
    not back) the model's wrapper and backward's only count (`pair_forward`, `pair_backward`)."""
    def forward(grad: bool) -> None:
        if paused and t.paused_at is not None and not t.rearmed:
            t.pair_forward(grad)
        else:
            t.forward(now_us(), now_us(), "Net", grad_enabled=grad)

    forward(True)
    forward(False)
    if paused and t.paused_at is not None:
        t.pair_backward()
    else:
        t.backward(now_us(), now_us())
    for _ in range(evals):
        forward(False)


def test_a_loop_of_pairs_counts_each_forward_that_begins_a_step_and_resumes_on_one():
    """Paused at a training forward that begins a step, the model's wrapper and backward's count: a forward after
    the step's backward begins the next (TRAIN with gradients, EVAL under no_grad), one inside a step does not; once
    the hooks are back the next forward that begins a step resumes timing, and is timed."""
    t, events, paused = _sampled_tracker({})
    for _ in range(2):
        _pair_iteration(t, paused=False)
    _pair_iteration(t, paused=False, evals=2)  # decides the loop: an evaluation after a manual update
    t.pause_after_us = now_us()
    _pair_iteration(t, paused=True)  # TRAIN 2 closes, this iteration (TRAIN 3) is the first one counted
    assert t.paused_at is not None and paused
    _pair_iteration(t, paused=True, evals=3)  # TRAIN 4, EVAL 2..4
    _pair_iteration(t, paused=True)  # TRAIN 5
    t.rearmed = True
    _pair_iteration(t, paused=True)  # resumes at its forward: TRAIN 6 is timed
    assert t.paused_at is None
    _pair_iteration(t, paused=False, evals=1)  # TRAIN 7, EVAL 5
    t.finish()
    steps = [(e[4], e[5]) for e in events if e[0] == STEP]
    assert steps == [(TRAIN, 0), (TRAIN, 1), (TRAIN, 2), (EVAL, 0), (EVAL, 1), (TRAIN, 6), (TRAIN, 7), (EVAL, 5)]
    counted = {e[4]: json.loads(e[7]) for e in events if e[0] == UNTIMED}
    assert {m: (c["first"], c["steps"]) for m, c in counted.items()} == {TRAIN: (3, 3), EVAL: (2, 3)}
    assert t.counts == {TRAIN: 8, EVAL: 6, GLOBAL: 0}
    assert all(e[5] is not None for e in events if e[0] in (FORWARD, BACKWARD))


def test_a_run_ending_while_paused_records_what_it_counted():
    counted = {TRAIN: 0}
    t, events, _ = _sampled_tracker(counted)
    _train_batch(t)
    t.pause_after_us = now_us()
    t.batch_begin(1, grad_enabled=True)
    counted[TRAIN] = 7
    t.finish()
    assert [json.loads(e[7])["steps"] for e in events if e[0] == UNTIMED] == [7]
    assert t.counts[TRAIN] == 8 and t.paused_at is None


def test_a_loop_that_leaves_its_boundaries_while_paused_resumes_at_its_next_phase():
    t, events, _ = _sampled_tracker({TRAIN: 3})
    _train_batch(t)
    t.pause_after_us = now_us()
    t.batch_begin(1, grad_enabled=True)
    t.forward(now_us(), now_us(), "Net", grad_enabled=False)  # no batch since: ignored while paused
    assert t.paused_at is not None
    t.resume_any = True  # the timer saw no boundary for a whole period with the hooks back
    t.forward(now_us(), now_us(), "Net", grad_enabled=False)
    assert t.paused_at is None and t.counts[TRAIN] == 4
    assert [e[0] for e in events].count(FORWARD) == 2  # step 0's, and this one (outside any step)


def test_a_step_that_takes_batches_from_two_loaders_is_never_sampled():
    """`for a, b in zip(labeled, unlabeled)`: counting both iterators' batches would count each step twice."""
    t, _, _ = _sampled_tracker({TRAIN: 0})
    _train_batch(t)
    assert not t.several_loaders
    t0 = t.batch_begin(1, grad_enabled=True)
    t.batch_end(1, t0, exhausted=False)
    t0 = t.batch_begin(2, grad_enabled=True)  # the second loader, same step
    t.batch_end(2, t0, exhausted=False)
    assert t.several_loaders
