"""`ProfilerCallback`: a `keras.callbacks.Callback` that marks each batch of `fit`, `evaluate` and `predict` as
one stallwatch step (see stallwatch.keras.loop for the phases each backend records).

Recording: under `stallwatch run` it joins that run (added by itself to every `fit`/`evaluate`/`predict`
there, so nobody needs to pass it); otherwise it records a run of its own from the first loop it sees until
`close()` or the end of the process, so a `fit`, `evaluate` and `predict` given the same callback are one run
(settings as in `stallwatch.torch.profile()`). Every method swallows its own failures (said once): training
never sees stallwatch."""

from __future__ import annotations

import functools
from typing import Any

import keras

from stallwatch.integrations import Recorder
from stallwatch.keras import inputs
from stallwatch.keras.loop import KerasLoop, backend_name, for_session
from stallwatch.log import warn_once

LOOPS = ("train", "test", "predict")


def _never_raises(fn: Any) -> Any:
    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(self, *args, **kwargs)
        except Exception as exc:
            warn_once(f"keras-{fn.__name__}-{type(exc).__name__}", "stallwatch's Keras callback failed in %s "
                      "(%s: %s); training goes on", fn.__name__, type(exc).__name__, exc)
    return method


class ProfilerCallback(keras.callbacks.Callback):
    """Marks Keras batches as stallwatch steps: training batches TRAIN, validation and `evaluate` batches
    EVAL (test_step), `predict` batches EVAL (predict_step).

        model.fit(x, y, callbacks=[ProfilerCallback()])                 # under `stallwatch run`
        cb = ProfilerCallback(out="runs/exp1")                           # records a run itself,
        model.fit(x, y, callbacks=[cb]); model.evaluate(xt, yt, callbacks=[cb]); cb.close()  # until close()

    Keras calls it synchronously after every batch (it is not async-safe on purpose: a step ends when the
    batch's results exist, as with the progress bar on)."""

    def __init__(self, out: str | None = None, **fields: Any) -> None:
        super().__init__()
        self._backend = backend_name()
        self._recorder = Recorder(out, torch_hooks=self._backend == "torch", **fields)
        self._loop: KerasLoop | None = None
        self._depth = 0
        try:
            inputs.patch_epoch_iterator(time_fetches=self._backend != "tensorflow")
        except Exception as exc:
            warn_once("keras-patch-inputs", "stallwatch cannot follow Keras's input (%s: %s); steps are still "
                      "recorded, without their data wait", type(exc).__name__, exc)

    # -- a loop begins and ends -------------------------------------------------------------------------
    def _loop_begin(self, kind: str) -> None:
        self._depth += 1
        if self._depth == 1:
            self._recorder.start()
            from stallwatch.torch.session import current

            session = current() if self._recorder.recording else None
            self._loop = for_session(session) if session is not None else None
            if self._loop is not None:
                self._loop.claim(self.model)
        if self._loop is not None:
            self._loop.loop_begins(kind, self.model)

    def _loop_end(self, kind: str) -> None:
        loop = self._loop
        if loop is not None:
            loop.end()
            if kind == "train":
                loop.unwrap_optimizer()
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            self._loop = None
            if loop is not None:
                loop.release()

    def close(self) -> None:
        """Finish the run this callback records itself (read it in the same process after this); under
        `stallwatch run`, nothing: the run ends with the job. Never raises."""
        try:
            if self._loop is not None:
                self._loop.release()
                self._loop, self._depth = None, 0
        except Exception as exc:
            warn_once("keras-close", "stallwatch could not end a Keras loop cleanly (%s: %s)", type(exc).__name__, exc)
        self._recorder.stop()

    @_never_raises
    def on_train_begin(self, logs: Any = None) -> None:
        self._loop_begin("train")

    @_never_raises
    def on_train_end(self, logs: Any = None) -> None:
        self._loop_end("train")

    @_never_raises
    def on_test_begin(self, logs: Any = None) -> None:
        self._loop_begin("test")

    @_never_raises
    def on_test_end(self, logs: Any = None) -> None:
        self._loop_end("test")

    @_never_raises
    def on_predict_begin(self, logs: Any = None) -> None:
        self._loop_begin("predict")

    @_never_raises
    def on_predict_end(self, logs: Any = None) -> None:
        self._loop_end("predict")

    # -- steps --------------------------------------------------------------------------------------------
    @_never_raises
    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._loop is not None:
            self._loop.begin("train")

    @_never_raises
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._loop is not None:
            self._loop.end()
            if self._recorder.stop_requested() and self.model is not None:
                self.model.stop_training = True  # Keras ends the fit after this batch

    @_never_raises
    def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._loop is not None:
            self._loop.begin("test")

    @_never_raises
    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._loop is not None:
            self._loop.end()

    @_never_raises
    def on_predict_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._loop is not None:
            self._loop.begin("predict")

    @_never_raises
    def on_predict_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._loop is not None:
            self._loop.end()
