"""Hugging Face Trainer callback: exact steps, since accelerate's data loader fetches one batch ahead and the
Trainer fetches a whole gradient-accumulation group before the step that uses it.

    trainer = Trainer(..., callbacks=[StallwatchCallback()])                 # under `stallwatch run`
    trainer = Trainer(..., callbacks=[StallwatchCallback(out="runs/exp1")])  # records a run itself

A TRAIN step is one optimizer step, what the Trainer itself calls a step (`global_step`, `max_steps`,
`eval_steps`): with `gradient_accumulation_steps=N` it holds N forwards and backwards and one optimizer
phase. It begins when the Trainer asks for the step's batches (`get_batch_samples`, so fetching them is the
step's data wait; `on_step_begin` where that cannot be wrapped) and ends at `on_step_end`.

An EVAL step is one evaluation or prediction batch: from the Trainer's `prediction_step` (batches fetched
since the step before are its data wait) to `on_prediction_step`, the only per-batch event the Trainer has.

Both wraps are on the Trainer instance, found when the callback first hears from it (`on_init_end`,
`on_train_begin`), or given by `attach(trainer)`. Under `stallwatch run` the callback joins that run;
otherwise it records a run of its own during `train()` (and during an `evaluate()`/`predict()` outside it)."""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

from transformers import TrainerCallback

from stallwatch.integrations import Recorder, under_stallwatch_run
from stallwatch.log import warn_once
from stallwatch.records import EVAL, TRAIN

OWNER_ATTR = "_stallwatch_callback"  # on the Trainer: the one callback of ours that marks its steps
FRAMES_TO_SEARCH = 12


def _never_raises(fn: Any) -> Any:
    @functools.wraps(fn)
    def event(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(self, *args, **kwargs)
        except Exception as exc:
            warn_once(f"transformers-{fn.__name__}", "stallwatch's Trainer callback failed in %s (%s: %s); "
                      "training goes on", fn.__name__, type(exc).__name__, exc)
        return None  # the Trainer's control is left as it is
    return event


class StallwatchCallback(TrainerCallback):
    """Marks the Trainer's optimizer steps (TRAIN) and evaluation batches (EVAL) as stallwatch steps."""

    def __init__(self, out: str | None = None, **fields: Any) -> None:
        self.recorder = Recorder(out, **fields)
        self._trainer: weakref.ref[Any] | None = None
        self._inactive = False  # another callback of ours already marks this trainer's steps
        self._stepped = False  # the open TRAIN step has reached on_step_begin (it has batches)
        self._recording_for_eval = False  # the recording was started by an evaluate()/predict() outside train()

    # -- the trainer ----------------------------------------------------------------------------------
    def attach(self, trainer: Any) -> None:
        """Wrap the trainer's batch requests and prediction steps (once; another callback of ours that
        attached first keeps the job, and this one stays quiet)."""
        if self._trainer is not None and self._trainer() is trainer:
            return
        owner = getattr(trainer, OWNER_ATTR, None)
        if owner is not None and owner is not self:
            self._inactive = True
            return
        setattr(trainer, OWNER_ATTR, self)
        self._trainer = weakref.ref(trainer)
        _wrap(trainer, "get_batch_samples", self._before_train_batches)
        _wrap(trainer, "prediction_step", self._before_prediction)

    def _find_trainer(self) -> None:
        """The Trainer that is calling us, from the call stack (callbacks are not given it)."""
        if self._trainer is not None or self._inactive:
            return
        trainer_cls = getattr(sys.modules.get("transformers.trainer"), "Trainer", None)
        if trainer_cls is None:
            return
        frame = sys._getframe(1)
        for _ in range(FRAMES_TO_SEARCH):
            if frame is None:
                return
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, trainer_cls):
                self.attach(candidate)
                return
            frame = frame.f_back

    def _before_train_batches(self) -> None:
        if self._inactive:
            return
        if self.recorder.open_mode == TRAIN and not self._stepped:
            return  # the last request found no batch (an iterable data set ran out): it stays this step's
        self.recorder.begin(TRAIN)
        self._stepped = False

    def _before_prediction(self) -> None:
        if self._inactive:
            return
        trainer = self._trainer() if self._trainer is not None else None
        if not self.recorder.recording and not getattr(trainer, "is_in_train", False):
            self.recorder.start()
            self._recording_for_eval = self.recorder.recording
        self.recorder.begin(EVAL)

    # -- events ---------------------------------------------------------------------------------------
    @_never_raises
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._find_trainer()

    @_never_raises
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._find_trainer()
        if not self._inactive:
            self._recording_for_eval = False
            self.recorder.start()

    @_never_raises
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._inactive:
            return
        if self.recorder.open_mode != TRAIN:
            self.recorder.begin(TRAIN)  # not wrapped: the step starts here, its batches already fetched
        self._stepped = True

    @_never_raises
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.end(TRAIN)
        if self.recorder.stop_requested():
            control.should_training_stop = True

    @_never_raises
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stepped:  # the loop stopped inside an accumulation group
            self.recorder.end(TRAIN)

    @_never_raises
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._inactive:
            self.recorder.end(TRAIN)
            self.recorder.stop()

    @_never_raises
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.end(EVAL)

    @_never_raises
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._eval_done()

    @_never_raises
    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._eval_done()

    def _eval_done(self) -> None:
        self.recorder.end(EVAL)
        if self._recording_for_eval:
            self._recording_for_eval = False
            self.recorder.stop()


def _wrap(trainer: Any, name: str, before: Any) -> None:
    """`trainer.<name>` (on the instance, so a subclass's override is what runs) calls `before()` first."""
    original = getattr(trainer, name, None)
    if original is None or getattr(original, "__stallwatch_original__", None) is not None:
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            before()
        except Exception as exc:
            warn_once(f"transformers-{name}", "stallwatch's %s wrapper failed (%s: %s); training goes on",
                      name, type(exc).__name__, exc)
        return original(*args, **kwargs)

    wrapper.__stallwatch_original__ = original  # type: ignore[attr-defined]
    setattr(trainer, name, wrapper)


# -- zero-code registration ---------------------------------------------------------------------------
def auto_register() -> None:
    """Under `stallwatch run`: every Trainer gets the callback unless the user gave one. Runs right after
    `transformers.trainer` is imported (autoload): `import transformers` alone stays as cheap as it was."""
    trainer_cls = getattr(sys.modules.get("transformers.trainer"), "Trainer", None)
    if trainer_cls is None or getattr(trainer_cls.__init__, "__stallwatch_original__", None) is not None:
        return
    original = trainer_cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            if under_stallwatch_run():
                _ensure_callback(self)
        except Exception as exc:
            warn_once("transformers-auto-register", "stallwatch could not add its Trainer callback (%s: %s)",
                      type(exc).__name__, exc)

    __init__.__stallwatch_original__ = original  # type: ignore[attr-defined]
    trainer_cls.__init__ = __init__


def _ensure_callback(trainer: Any) -> None:
    if getattr(trainer, OWNER_ATTR, None) is not None:
        return  # a subclass's __init__ ran ours already, or the user's callback attached itself
    handler = trainer.callback_handler
    ours = next((cb for cb in handler.callbacks if isinstance(cb, StallwatchCallback)), None)
    if ours is None:
        ours = StallwatchCallback()
        handler.callbacks.append(ours)
    ours.attach(trainer)
