"""Turns what the hooks see (batches fetched, forward, backward, optimizer steps) into steps: each step's
start, end, number and mode, with its phases. Pure Python, no torch: the hooks feed it timestamps.

Where steps come from, best first: explicit marks (`prof.step()`, the Lightning and Transformers callbacks);
the data loader (a step runs from asking for a batch to asking for the next one); and, when the loop never
iterates a DataLoader, whatever repeats: `optimizer.step()` (with several optimizers, an iteration ends when the
one that stepped first in it steps again), else top-level forward/backward pairs (a manual update such as
`p.data.add_(p.grad, alpha=-lr)`). Steps are contiguous whatever delimits them: a step delimited
by `optimizer.step()` runs on until the next iteration's first call, so what the loop does after the update (a
`loss.item()` that waits for the GPU, logging, building the next batch by hand) is in a step, as it is with a
DataLoader. Until an optimizer step is seen the loop's first iterations are held undecided (a gradient-accumulation
loop is one step per optimizer step, not per micro-batch). Without a DataLoader, each top-level forward pass under
`no_grad` outside a training step is one EVAL step. How a rank's steps were delimited is recorded as a `loop`
marker, and a loop whose boundary cannot be found says so."""

from __future__ import annotations

import time
from typing import Callable, Protocol

from stallwatch.log import warn_once
from stallwatch.torch.memory import StepMemory
from stallwatch.torch.runqueue import PEER_READ_COST_US, PeerRunQueue, RunQueueClock
from stallwatch.records import (
    BACKWARD, DATA_WAIT, EVAL, FORWARD, GLOBAL, LOOP, MEMORY_LIMIT, OPTIMIZER, STEP, TRAIN, UNTIMED,
)

LOADER, EXPLICIT, OPTIMIZER_SOURCE, PAIRS = "loader", "explicit", "optimizer", "pairs"
UNDETERMINED = "undetermined"
INFERRED = (None, OPTIMIZER_SOURCE, PAIRS)  # sources under which steps are inferred from the model's calls
MAX_UNDECIDED_ITERATIONS = 32  # forward/backward pairs held before deciding there is no optimizer step
MAX_EVENTS_PER_STEP = 10_000  # a step that records more (a loop inside one step) keeps its first ones
MAX_PENDING_WAITS = 64
STEP_NAMES = {TRAIN: "train_step", EVAL: "eval_step", GLOBAL: "step"}
RATE_EVERY = 256  # `on_rate` hears the time of every this many timed steps (sampling decides by the rate)
PEER_BUDGET = 250  # the peers' delay is read at a step's end when the reads cost at most 1/this of the step


_time_ns = time.time_ns


def now_us() -> int:
    return _time_ns() // 1000


def expand(record: tuple) -> list[tuple]:
    """A step record (FrameworkEvent fields + its phases as `(kind, name, start_us, end_us, args)`) as the
    step's events, each in FrameworkEvent field order; any other event as itself."""
    if len(record) != 9:
        return [record]
    kind, name, start, end, mode, step, pid, args, phases = record
    return [(kind, name, start, end, mode, step, pid, args),
            *((k, n, t0, t1, mode, step, pid, a) for k, n, t0, t1, a in phases)]


class StepListener(Protocol):
    """Told about step boundaries in the training thread (the profiling windows start and stop there)."""

    def on_step_begin(self, mode: str, step: int, now_us: int) -> None: ...
    def on_step_end(self, mode: str, step: int, start_us: int, end_us: int) -> None: ...


WAIT_RUNQ_MIN_US = 200  # a wait for a batch this long or longer has its own run-queue delay read (`wait_runq_us`)


class _Step:
    __slots__ = ("start_us", "last_us", "events", "work", "backward", "forward", "mode", "loader",
                 "predicted_mode", "predicted_step", "cuts", "backward_since_cut", "forwards", "name", "updated",
                 "first_optimizer", "next_at", "counted", "runq0", "wait_runq")

    def __init__(self, start_us: int, mode: str | None, predicted_mode: str, predicted_step: int,
                 loader: int | None = None) -> None:
        self.start_us = start_us
        self.last_us = start_us
        self.events: list[tuple] = []  # (kind, name, start_us, end_us, args)
        self.work = False  # forward, backward or optimizer seen: the next batch request ends this step
        self.backward = False
        self.forward = False
        self.mode = mode  # given explicitly, else resolved at the end
        self.loader = loader
        self.predicted_mode = predicted_mode
        self.predicted_step = predicted_step
        self.cuts: list[tuple[int, int]] = []  # undecided loop: (time, index in events) where an iteration began
        self.backward_since_cut = False
        self.forwards = 0
        self.name: str | None = None  # the step event's name when a framework names it (Keras: "predict_step")
        # Optimizer-delimited: `updated` once an optimizer stepped. The next model call may begin the next iteration
        # (`next_at`: when it began) or be the same iteration's other optimizer's (a GAN's generator after its
        # discriminator): the next optimizer.step() decides, by whether it is the step's first.
        self.updated = False
        self.first_optimizer: int | None = None
        self.next_at: int | None = None
        self.counted = False  # the rest of an iteration that was counted, not timed: never recorded
        self.runq0 = -1  # the training thread's run-queue delay (ns) when the step began; -1: not read
        # of that, the part spent in the step's opening wait for its batch (µs); -1: not measured. Spread over the
        # step, a preempted training thread read as less data wait than a sleeping read really took
        self.wait_runq = -1


class StepTracker:
    """Not thread-safe: the training thread is its only caller (the hooks call it there)."""

    def __init__(self, emit, pid: int, listener: StepListener | None = None) -> None:
        """`emit(tuple)` takes an event in FrameworkEvent field order (the sender's hot path)."""
        self._emit = emit
        self.pid = pid
        self.listener = listener
        self.counts = {TRAIN: 0, EVAL: 0, GLOBAL: 0}
        self.source: str | None = None
        self._open: _Step | None = None
        self._pending: list[tuple] = []  # data waits seen outside an explicit step: they belong to the next
        self._loader_modes: dict[int, str] = {}
        self._wait_args: dict[int, str] = {}  # loader key -> its data waits' args (made once per loader)
        self._last_end = 0  # steps never overlap: a step starts no earlier than the previous one ended
        self._optimizing = False  # inside optimizer.step(): a closure's forward/backward belong to this step
        self._optimizer_mark: tuple[_Step | None, int] = (None, 0)  # the step, and its events, when it began
        self._closures: list[tuple[int, int]] = []  # the closure's calls inside the optimizer step in progress
        self._carried: list[tuple] = []  # recorded inside the next iteration's first call before it was reported
        # Sampled steps (torch/sampling.py): from the first step boundary at or after `pause_after_us` (0: never)
        # steps are counted, not timed, until `resume()`; what was counted is recorded as `untimed` markers.
        self.pause_after_us = 0
        self.paused_at: int | None = None
        self.rearmed = False  # set while paused when the hooks are back: the next mark resumes
        self.resume_any = False  # set while paused: the next phase seen resumes (the loop left its boundary)
        self.on_pause: Callable[[int], None] | None = None
        self.on_resume: Callable[[int, int], None] | None = None  # (steps counted, µs paused)
        self.count_paused: Callable[[], dict[str, int]] | None = None  # loader-delimited steps counted elsewhere
        self._marks_paused: dict[str, int] = {}  # explicit marks (or optimizer steps) while paused, per mode
        self.counted_optimizer = 0  # paused in an optimizer-delimited loop: the optimizer whose steps are counted
        # paused in a loop of forward/backward pairs: a counted training step is open, and has had its backward
        self._pair_open = self._pair_backward = False
        self.on_rate: Callable[[int], None] | None = None
        self._timed = 0  # steps recorded (timed), all modes
        self.several_loaders = False  # a step asked two loaders for batches: steps are not sampled
        # Each step's run-queue delay (the time the training thread waited for a CPU): one read per boundary, the
        # reading at a step's end reused as the next one's start when they meet (most loops)
        self._runq = RunQueueClock()
        self._runq_at = -1
        self._runq_said = False  # a delay was recorded: before it, a step measured at 0 says so (not unmeasured)
        # ... and the largest delay of its native peers (the intra-op pool it waits for at a barrier): read at the
        # end of steps long enough for the reads to cost little, counted for a step whose start was read too
        self._peers = PeerRunQueue()
        self._peers_at = -1
        self._memory = StepMemory()  # each step's resident set (and CUDA allocator) at its end: torch/memory.py

    @property
    def in_step(self) -> bool:
        return self._open is not None

    # -- the data loader ------------------------------------------------------------------------------
    def batch_begin(self, loader: int, grad_enabled: bool) -> int:
        """A batch is asked for: with loader-delimited steps, the step before ends and a new one begins. Returns
        when the wait for the batch begins: after this bookkeeping, which is stallwatch's time, not the loader's
        (in a loop of 50 µs steps it is a fifth of the step, and InputBound would read it as data loading)."""
        t0 = now_us()
        if self.source == EXPLICIT:
            return t0
        step = self._open
        if step is not None and step.cuts:
            self._decide(PAIRS, t0)  # iterations before the first DataLoader were forward/backward pairs
            step = self._open
        if step is not None and step.work:
            self._close(t0)
            step = None
        elif step is not None and step.loader is not None and step.loader != loader:
            # Two loaders' batches in one step (`zip(labeled, unlabeled)`): counting batches would count each
            # step twice, so such a loop is never sampled.
            self.several_loaders = True
        if step is None:
            if self.pause_after_us and t0 >= self.pause_after_us and self.source == LOADER and self.listener is None:
                self._pause(t0)
                return t0
            mode = self.loader_mode(loader, grad_enabled)
            self._begin(_Step(t0, None, mode, self.counts[mode], loader))
            return now_us()
        return t0

    def loader_mode(self, loader: int, grad_enabled: bool) -> str:
        """The mode of a loader's steps: what its steps were so far, else by whether gradients are on."""
        return self._loader_modes.get(loader) or (TRAIN if grad_enabled else EVAL)

    def batch_end(self, loader: int, t0: int, exhausted: bool) -> None:
        t1 = now_us()
        args = self._wait_args.get(loader) or self._loader_args(loader)
        if self.source == EXPLICIT:
            if self._open is not None and not self._open.work:  # fetched inside `with prof.step():`
                self._opening_wait(self._open, t1 - t0)
                self._add(self._open, DATA_WAIT, "next_batch", t0, t1, args)
            elif not exhausted:  # fetched for the next step (before its mark, or after this one's work)
                self._pending.append((t0, t1, args))
                del self._pending[:-MAX_PENDING_WAITS]
            return
        if self.source != LOADER:
            self._decide(LOADER, t1)
        step = self._open
        if step is None:
            return
        if exhausted:
            if not step.work:
                self._open = None  # the request that found the loader empty: no step
            return
        self._opening_wait(step, t1 - t0)
        self._add(step, DATA_WAIT, "next_batch", t0, t1, args)

    def _opening_wait(self, step: _Step, waited_us: int) -> None:
        """A wait for a batch that opens `step` just ended: the run-queue delay since the step began is the wait's.
        Read only for a wait long enough to matter: in a loop of sub-ms steps the read would be most of the hooks'
        cost, and a shorter wait's share is left as the delay spread over the step says."""
        if waited_us >= WAIT_RUNQ_MIN_US and step.runq0 >= 0 and not step.events and not step.work:
            runq = self._runq.read()
            if runq >= 0:
                step.wait_runq = max(runq - step.runq0, 0) // 1000

    def _loader_args(self, loader: int) -> str:
        """A data wait's args name the loader it waited for (its `dataloader` event's `key`): made once per loader,
        so the hot path only looks it up."""
        args = self._wait_args[loader] = '{"loader": %d}' % loader
        return args

    # -- phases ---------------------------------------------------------------------------------------
    # The phase methods run a few times per step: the common case (inside a step) is inlined.
    def forward(self, t0: int, t1: int, name: str, grad_enabled: bool) -> None:
        if self.paused_at is not None and self.source == PAIRS and not self.resume_any \
                and not self._paused_pair(grad_enabled, t0):
            return
        step = self._open
        if step is not None and step.updated and not self._optimizing:
            if grad_enabled:
                if step.next_at is None:
                    step.next_at = t0
            else:  # an evaluation after the update: the iteration ended here
                step.next_at = None
                self._next_iteration(t0)
                step = None
        if step is None:
            if self.paused_at is not None and not self._resumed_by_phase(t0):
                return
            if self.source not in INFERRED:
                self._standalone(FORWARD, name, t0, t1, TRAIN if grad_enabled else EVAL)
                return
            if not grad_enabled:
                self._eval_step(name, t0, t1)
                return
            if self._pause_pairs(t0):
                return
            step = self._inferred_step(t0)
        elif step.backward_since_cut and step.mode is None and self.source in (None, PAIRS) \
                and step.loader is None and not self._optimizing:
            # Training work done and no optimizer step ended it: this forward starts the next iteration.
            if not grad_enabled:  # an evaluation after a manual update: there is no optimizer step
                self._decide(PAIRS, t0)
                self._close(t0)
                self._eval_step(name, t0, t1)
                return
            if self.source == PAIRS:
                self._close(t0)
                if self._pause_pairs(t0):
                    return
                step = self._inferred_step(t0)
            else:
                step.cuts.append((t0, len(step.events)))
                step.backward_since_cut = False
                if len(step.cuts) >= MAX_UNDECIDED_ITERATIONS:
                    self._decide(PAIRS, t0)
                    step = self._open or self._inferred_step(t0)
        step.work = step.forward = True
        step.forwards += 1
        if t1 > step.last_us:
            step.last_us = t1
        if len(step.events) < MAX_EVENTS_PER_STEP:
            step.events.append((FORWARD, name, t0, t1, ""))

    def backward(self, t0: int, t1: int) -> None:
        self._train_phase(BACKWARD, "backward", t0, t1)

    def optimizer_begin(self, t0: int, who: int = 0) -> None:
        """optimizer.step() starts (`who`: which optimizer): a loop with an optimizer is delimited by it (the
        iterations held undecided become this one step); an LBFGS-style closure's forward and backward happen
        inside it."""
        if self.paused_at is not None and not self._resumed_by_phase(t0):
            return
        self._optimizing = True
        if self.source is None:
            self._decide(OPTIMIZER_SOURCE, t0)
        if self._open is not None and self._open.updated:
            self._same_or_next_iteration(t0, who, may_pause=True)
            if self.paused_at is not None:
                return
        if self._open is None and self.source == OPTIMIZER_SOURCE:
            self._inferred_step(t0)
        step = self._open
        self._optimizer_mark = (step, len(step.events) if step is not None else 0)
        if self._closures:
            self._closures = []

    def closure(self, t0: int, t1: int) -> None:
        """The closure given to optimizer.step() ran from `t0` to `t1` (LBFGS calls it several times; Lightning's
        automatic optimization runs `training_step` in it): the loop's own code, never the optimizer's."""
        if self._optimizing and len(self._closures) < MAX_PENDING_WAITS:
            self._closures.append((t0, t1))

    def optimizer(self, t0: int, t1: int, name: str, who: int = 0) -> None:
        self._optimizing = False
        if self.paused_at is not None and not self._resumed_by_phase(t0):
            return
        if self.source is None:
            self._decide(OPTIMIZER_SOURCE, t0)
        if self._open is not None and self._open.updated:  # no optimizer_begin for this one (a caller without it)
            self._same_or_next_iteration(t0, who)
        step = self._open
        if step is None:
            if self.source in INFERRED:
                step = self._inferred_step(t0)
            else:
                self._standalone(OPTIMIZER, name, t0, t1, TRAIN)
                return
        step.work = step.backward = True
        # A closure ran inside the optimizer's call: only the time around it is the optimizer's own (else LBFGS
        # reads "optimizer 100 %", and Lightning's automatic optimization, whose closure is `training_step` with
        # its logging, reads "optimizer 85 %" for a 0.25 ms update). What the closure did outside forward and
        # backward is the loop's own code. Its forward and backward, among the events recorded since the call
        # began, are left out too (an optimizer whose closure was not seen); most steps have neither.
        marked, mark = self._optimizer_mark
        since = step.events[mark:] if marked is step else step.events
        closures, self._closures = self._closures, []
        inner = sorted([*((e[2], e[3]) for e in since if e[0] in (FORWARD, BACKWARD) and e[2] >= t0 and e[3] <= t1),
                        *((c0, c1) for c0, c1 in closures if c0 >= t0 and c1 <= t1)]) \
            if since or closures else ()
        at, pieces = t0, 0
        for s0, s1 in inner:
            if s0 > at:
                self._add(step, OPTIMIZER, name, at, s0, "")
                pieces += 1
            at = max(at, s1)
        if t1 > at or not pieces:
            self._add(step, OPTIMIZER, name, min(at, t1), t1, "")
        if self.source == OPTIMIZER_SOURCE:
            step.updated = True
            if step.first_optimizer is None:
                step.first_optimizer = who

    def _train_phase(self, kind: str, name: str, t0: int, t1: int) -> None:
        """Backward: the step it is in becomes a TRAIN step."""
        if self.paused_at is not None and self.source == PAIRS and not self.resume_any:
            self.pair_backward()
            return
        step = self._open
        if step is not None and step.updated and step.next_at is None:
            step.next_at = t0  # a backward first (the model's call was not seen): as a forward
        if step is None:
            if self.paused_at is not None and not self._resumed_by_phase(t0):
                return
            if self.source in INFERRED:
                step = self._inferred_step(t0)
            else:
                self._standalone(kind, name, t0, t1, TRAIN)
                return
        step.work = step.backward = step.backward_since_cut = True
        if t1 > step.last_us:
            step.last_us = t1
        if len(step.events) < MAX_EVENTS_PER_STEP:
            step.events.append((kind, name, t0, t1, ""))

    def other(self, kind: str, name: str, t0: int, t1: int, args: str = "") -> None:
        """Anything else timed inside the loop (a collective, a fetch in the main process…)."""
        step = self._open
        if step is None:
            if self.paused_at is not None and not self._resumed_by_phase(t0):
                return
            self._standalone(kind, name, t0, t1, GLOBAL)
        else:
            self._add(step, kind, name, t0, t1, args)

    # -- explicit marks -------------------------------------------------------------------------------
    def begin_step(self, mode: str | None, name: str | None = None) -> None:
        """An explicit step begins now (ending the one before); a batch fetched since then belongs to it.
        `name` names the step event (default: train_step / eval_step)."""
        t = now_us()
        if self.paused_at is not None:
            if not (self.rearmed or self.resume_any):  # steps are counted, not timed: a mark costs a count
                key = mode or TRAIN
                self._marks_paused[key] = self._marks_paused.get(key, 0) + 1
                return
            self.resume(t)
        if self.source != EXPLICIT and self._open is not None:
            # Hand-over from automatic steps: the open one ends here, with what it did.
            if not self._open.work:
                self._pending = [(e[2], e[3], e[4]) for e in self._open.events if e[0] == DATA_WAIT]
                self._open = None
            elif self._open.cuts:
                self._decide(PAIRS, t)
        self._decide(EXPLICIT, t)
        if self._open is not None:
            # Marker style: the step before ended when the batch for this one was asked for.
            fetched = self._pending[0][0] if self._pending else t
            self._close(fetched if self._open.last_us <= fetched <= t else t)
        if self.pause_after_us and t >= self.pause_after_us and self.listener is None:
            self._pending.clear()
            self._pause(t)
            self._marks_paused[mode or TRAIN] = 1
            return
        start = max(self._pending[0][0], self._last_end) if self._pending else t
        predicted = mode or TRAIN
        step = _Step(start, mode, predicted, self.counts[predicted])
        step.name = name
        for t0, t1, args in self._pending:
            self._add(step, DATA_WAIT, "next_batch", t0, t1, args)
        fetched_before = bool(self._pending)
        self._pending.clear()
        self._begin(step)
        if fetched_before and step.runq0 >= 0:
            step.wait_runq = 0  # its delay is read from the mark, after the fetch: none of it fell in the wait

    def end_step(self) -> None:
        if self._open is not None and self.paused_at is None:
            self._close(now_us())

    def take_over(self, args: str) -> None:
        """A framework integration (Keras) marks every step from now on: the steps are explicit, recorded with
        a `loop` marker whose args say who marks them; an automatic step still open is dropped unfinished
        (what it held was the framework's set-up, not a step)."""
        t = now_us()
        self.resume(t)
        if self._open is not None and self._open.updated:
            self._close(self._open.last_us)  # a finished optimizer step, not set-up
        self._open = None
        self._pending.clear()
        self._optimizing = False
        if self.source == EXPLICIT:
            return
        self.source = EXPLICIT
        self._marker(EXPLICIT, t, args)

    def hand_back(self) -> None:
        """The integration's loop ended: a loop that follows is delimited afresh (a new `loop` marker)."""
        self.resume(now_us())
        if self._open is not None:
            self._close(now_us())
        self._pending.clear()
        self.source = None
        self._loader_modes.clear()

    def finish(self) -> None:
        """At exit: a step with work in it ends where its last phase ended; an empty one is dropped. A step cut
        short (a signal, an exception) keeps the mode its loop had, not the mode of the phases it reached."""
        self.pause_after_us = 0
        if self.paused_at is not None:
            self.resume(now_us())
        step = self._open
        if step is not None and step.updated and step.next_at is not None:
            step = self._unfinished_iteration(step.next_at)
        if step is not None and step.work:
            if step.cuts:
                self._decide(PAIRS, step.last_us)
                step = self._open
            elif self.source is None and not step.backward and step.forwards > 1:
                self._marker(UNDETERMINED, step.last_us, f'{{"forwards": {step.forwards}}}')
            if step is not None:
                if step.mode is None and not step.backward:
                    step.mode = (self._loader_modes.get(step.loader) if step.loader is not None else None) \
                        or step.predicted_mode
                self._close(step.last_us)
        self._open = None

    def close(self) -> None:
        """Give back the /proc files kept open for per-step reads: the job may run on after stallwatch stops."""
        self._runq.close()
        self._peers.close()
        self._memory.close()

    # -- sampled steps (torch/sampling.py) ------------------------------------------------------------
    def optimizer_counted(self, who: int) -> None:
        """Paused in an optimizer-delimited loop (the optimizer's hooks stay, reduced to this): the loop's first
        optimizer finished a step, so an iteration ended; once the hooks are back on, timing resumes here and
        the next iteration (from its first model call) is timed."""
        if who != self.counted_optimizer:
            return
        self._marks_paused[TRAIN] = self._marks_paused.get(TRAIN, 0) + 1
        if not (self.rearmed or self.resume_any):
            return
        t = now_us()
        self.resume(t)
        # What the iteration does after this update (another optimizer's step) is its own: held in an unrecorded
        # step, so the next timed step begins with the next iteration, as the first optimizer's next step decides.
        tail = _Step(t, None, TRAIN, self.counts[TRAIN])
        tail.work = tail.updated = tail.counted = True
        tail.first_optimizer = who
        self._open = tail

    def pair_forward(self, grad_enabled: bool) -> None:
        """Paused in a loop of forward/backward pairs (the model's wrapper and backward's stay on, reduced to this):
        a top-level forward of the model, counted as the step it begins, if it begins one."""
        if self.paused_at is not None and self.source == PAIRS:
            self._paused_pair(grad_enabled, None)

    def pair_backward(self) -> None:
        """Paused in a loop of forward/backward pairs: a backward. Without a forward counted since the last step
        ended it is a training step of its own, as when timed."""
        if self.paused_at is None or self.source != PAIRS:
            return
        if not self._pair_open:
            self._marks_paused[TRAIN] = self._marks_paused.get(TRAIN, 0) + 1
            self._pair_open = True
        self._pair_backward = True

    def _pause_pairs(self, t0: int) -> bool:
        """A forward with gradients on begins a training step in a loop of pairs: when a pause is due, timing
        pauses here and this step is the first one counted."""
        if self.source != PAIRS or not self.pause_after_us or t0 < self.pause_after_us or self.listener is not None:
            return False
        self._pause(t0)
        self._marks_paused = {TRAIN: 1}
        self._pair_open, self._pair_backward = True, False
        return True

    def _paused_pair(self, grad_enabled: bool, t0: int | None) -> bool:
        """A top-level forward while paused in a loop of pairs. It begins a step after the open one's backward, or
        when none is open: a TRAIN step with gradients on, an EVAL step without (as when timed). That step is
        counted, unless the hooks are back and this call was timed (`t0`): then timing resumes at it, and True
        says the caller records it as the first timed step's forward."""
        if self._pair_open and not self._pair_backward:
            return False  # inside the open step (a second forward, a target computed under no_grad)
        if t0 is not None and self.rearmed:
            self.resume(t0)
            return True
        mode = TRAIN if grad_enabled else EVAL
        self._marks_paused[mode] = self._marks_paused.get(mode, 0) + 1
        self._pair_open, self._pair_backward = grad_enabled, False
        return False

    def resume(self, t: int) -> None:
        """Timing resumes at `t`: the steps counted since the pause get their numbers (they took them in order)
        and are recorded, one `untimed` marker per mode (a second's worth: a job killed outright loses at most
        the stretch it was in); the next step boundary begins a timed step."""
        at = self.paused_at
        if at is None:
            return
        self.paused_at = None
        self.rearmed = self.resume_any = False
        self._pair_open = self._pair_backward = False
        if self.source in (EXPLICIT, OPTIMIZER_SOURCE, PAIRS) or self.count_paused is None:
            counts = self._marks_paused
        else:
            counts = self.count_paused()
        self._marks_paused = {}
        total = 0
        for mode, n in counts.items():
            if n <= 0:
                continue
            total += n
            first = self.counts.get(mode, 0)
            self.counts[mode] = first + n
            self._emit((UNTIMED, "steps", at, t, mode, None, self.pid,
                        f'{{"steps": {n}, "first": {first}, "stretches": 1, "us": {t - at}}}'))
        self._last_end = max(self._last_end, t)
        if self.on_resume is not None:
            self.on_resume(total, t - at)

    def _pause(self, t: int) -> None:
        self.paused_at = t
        self.pause_after_us = 0
        self._open = None
        if self.on_pause is not None:
            self.on_pause(t)

    def _resumed_by_phase(self, t: int) -> bool:
        """While paused, a phase is ignored (its step is being counted), unless no boundary came for a whole
        period since the hooks came back: the loop moved on without one, and timing resumes here."""
        if not self.resume_any:
            return False
        self.resume(t)
        return True

    # -- internals ------------------------------------------------------------------------------------
    def _decide(self, source: str, at_us: int) -> None:
        """The loop's steps are delimited by `source` from now on (recorded as a marker). Iterations held
        undecided become steps of their own when they were forward/backward pairs."""
        if source == self.source:
            return
        if source == OPTIMIZER_SOURCE:
            warn_once("steps-from-optimizer", "no DataLoader iteration seen: steps are delimited by "
                      "optimizer.step() (use stallwatch.torch.profile().step() to mark them yourself)")
        elif source == PAIRS:
            warn_once("steps-from-pairs", "no DataLoader and no optimizer.step() seen: each top-level forward "
                      "and its backward is one step (use stallwatch.torch.profile().step() to mark them yourself)")
        self.source = source
        self._marker(source, at_us)
        step = self._open
        if step is None or not step.cuts:
            return
        cuts, step.cuts = step.cuts, []
        if source != PAIRS:
            return  # one step, as the optimizer (or an explicit mark) will end it
        self._open = None
        starts = [step.start_us, *(t for t, _ in cuts)]
        first = 0
        for i, (t_cut, index) in enumerate(cuts):
            piece = _Step(starts[i], None, TRAIN, self.counts[TRAIN])
            piece.events = step.events[first:index]
            piece.work = piece.backward = piece.forward = True
            self._open = piece
            self._close(t_cut)
            first = index
        rest = _Step(starts[-1], None, TRAIN, self.counts[TRAIN])
        rest.events = step.events[first:]
        rest.work = bool(rest.events)
        rest.forward = any(e[0] == FORWARD for e in rest.events)
        rest.backward = rest.backward_since_cut = step.backward_since_cut
        rest.forwards = sum(1 for e in rest.events if e[0] == FORWARD)
        rest.last_us = max([starts[-1], *(e[3] for e in rest.events)])
        self._begin(rest)

    def _marker(self, name: str, at_us: int, args: str = "") -> None:
        self._emit((LOOP, name, at_us, at_us, GLOBAL, None, self.pid, args))

    def _same_or_next_iteration(self, t0: int, who: int, may_pause: bool = False) -> None:
        """An optimizer steps after the open step's update: the step's first optimizer again begins a new iteration,
        which began at `next_at` (the first model call since the update) or here; another optimizer (a generator
        after its discriminator, an actor after its critic, Muon beside AdamW) continues the same iteration.
        When a pause is due (`may_pause`: at the optimizer's start), this iteration is the first one counted."""
        step = self._open
        assert step is not None
        if who != step.first_optimizer:
            step.updated, step.next_at = False, None
            return
        at = step.next_at if step.next_at is not None else t0
        step.next_at = None
        self._next_iteration(at)
        if may_pause and self.pause_after_us and t0 >= self.pause_after_us and self.listener is None \
                and self.source == OPTIMIZER_SOURCE:
            self.counted_optimizer = who
            self._optimizing = False
            self._pause(at)
            return
        self._inferred_step(at)

    def _unfinished_iteration(self, at: int) -> _Step:
        """At exit, an iteration begun after the last update and never updated (cut short, or a last forward):
        a step of its own, as it was before the update's step stayed open."""
        self._next_iteration(at)
        rest = self._inferred_step(at)
        rest.work = True
        rest.forwards = sum(1 for e in rest.events if e[0] == FORWARD)
        rest.forward = rest.forwards > 0
        rest.backward = any(e[0] == BACKWARD for e in rest.events)
        rest.last_us = max([rest.start_us, *(e[3] for e in rest.events)])
        return rest

    def _next_iteration(self, t0: int) -> None:
        """An optimizer-delimited step ends where the next iteration's first call began. What was recorded since
        that call began (a collective inside it, reported before the call itself) moves to the next step."""
        step = self._open
        if step is None:
            return
        events = step.events
        cut = len(events)
        while cut and events[cut - 1][2] >= t0:
            cut -= 1
        if cut < len(events):
            self._carried = events[cut:]
            del events[cut:]
            self._close(t0)
        else:
            self._close(max(t0, step.last_us))

    def _inferred_step(self, t0: int) -> _Step:
        """A training step without a DataLoader or marks: begins with the model's (or optimizer's) first call."""
        step = _Step(max(t0, self._last_end), None, TRAIN, self.counts[TRAIN])
        self._begin(step)
        return step

    def _eval_step(self, name: str, t0: int, t1: int) -> None:
        """A top-level forward under no_grad outside a training step, without a DataLoader: one EVAL step."""
        step = _Step(t0, EVAL, EVAL, self.counts[EVAL])
        step.events.append((FORWARD, name, t0, t1, ""))
        step.work = step.forward = True
        self._begin(step)
        self._close(t1)

    def _begin(self, step: _Step) -> None:
        self._open = step
        step.runq0 = self._runq_at if step.start_us == self._last_end and self._runq_at >= 0 else self._runq.read()
        if self._carried:
            step.events[:0] = self._carried
            self._carried = []
        if self.listener is not None:
            self.listener.on_step_begin(step.predicted_mode, step.predicted_step, step.start_us)

    def _add(self, step: _Step, kind: str, name: str, t0: int, t1: int, args: str) -> None:
        if t1 > step.last_us:
            step.last_us = t1
        if len(step.events) < MAX_EVENTS_PER_STEP:
            step.events.append((kind, name, t0, t1, args))

    def _standalone(self, kind: str, name: str, t0: int, t1: int, mode: str) -> None:
        self._emit((kind, name, t0, t1, mode, None, self.pid, ""))

    def _close(self, end_us: int) -> None:
        step = self._open
        self._open = None
        if step is None or step.counted:
            return
        mode = step.mode or (TRAIN if step.backward else EVAL if step.forward else
                             self._loader_modes.get(step.loader, GLOBAL) if step.loader is not None else GLOBAL)
        number = self.counts[mode]
        self.counts[mode] = number + 1
        self._last_end = end_us
        self._timed += 1
        # ... and of the first (its end starts the first span): sampling can start after RATE_EVERY steps, not 2×
        if (self._timed == 1 or not self._timed % RATE_EVERY) and self.on_rate is not None:
            self.on_rate(end_us)
        if step.loader is not None and step.work:
            self._loader_modes[step.loader] = mode
        runq = self._runq_at = self._runq.read()
        waited = (runq - step.runq0) // 1000 if step.runq0 >= 0 and runq >= 0 else 0
        memory = self._memory
        mem = memory.read(end_us)
        if memory.limits:
            for name, limit in memory.limits:
                self._emit((MEMORY_LIMIT, name, end_us, end_us, GLOBAL, None, self.pid, limit))
            memory.limits.clear()
        if step.wait_runq >= 0 or waited > 0 or (not self._runq_said and step.runq0 >= 0 and runq >= 0):
            head = f'"runq_us": {waited}, "wait_runq_us": {step.wait_runq}' if step.wait_runq >= 0 \
                else f'"runq_us": {waited}'
            self._runq_said = True
        else:
            head = ""
        peers = self._peers
        if end_us - step.start_us >= PEER_BUDGET * PEER_READ_COST_US * max(peers.peers, 1):
            peer = peers.read()
            if peer > 0 and self._peers_at == step.start_us:
                head = f'{head}, "peer_runq_us": {peer}' if head else f'"peer_runq_us": {peer}'
            self._peers_at = end_us
        args = f"{{{head}, {mem}}}" if head and mem else f"{{{head or mem}}}" if head or mem else ""
        # One record per step, its phases inside: the fewest objects built in the training thread. All
        # tuples of plain values: the garbage collector stops tracking them while they wait to be sent
        # (lists would stay tracked and, thousands at a time, trigger full collections of the job's heap).
        self._emit((STEP, step.name or STEP_NAMES[mode], step.start_us, end_us, mode, number, self.pid,
                    args, tuple(step.events)))
        if self.listener is not None:
            self.listener.on_step_end(mode, number, step.start_us, end_us)
