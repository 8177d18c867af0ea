"""The steps of Keras's loops, for this process's profiling session: while `fit`, `evaluate` or `predict` runs,
Keras's batch callbacks mark every step and the automatic (PyTorch-hook) step detection stands down, so a
batch is counted once, as what Keras says it is.

Phases, by backend (what each can show without slowing the job, and why):
- data wait, on torch and JAX: each `next()` on Keras's epoch iterator, timed (inputs.py);
- forward and backward, on torch only: the PyTorch hooks time the model's call and `loss.backward()`
  inside a Keras step (outside steps they are off: Keras's own model building is not a step);
- optimizer, on torch (and on any backend with `run_eagerly=True`): `optimizer.apply`, wrapped on the
  instance for the length of the loop.
JAX and TensorFlow compile the whole train step (forward, backward and the optimizer's update) into one XLA
program or graph: it is one piece of the step; a detailed profiling window (the backend's own profiler)
shows inside it. TensorFlow reads the input inside that program too, so it has no data wait phase."""

from __future__ import annotations

import json
from typing import Any

from stallwatch.keras import inputs
from stallwatch.log import warn_once
from stallwatch.records import EVAL, TRAIN
from stallwatch.torch.steps import now_us

DATALOADER = "dataloader"
KERAS_INPUT = -1  # the tracker's loader key for Keras's batches
STEP_NAMES = {"train": "train_step", "test": "test_step", "predict": "predict_step"}
MODES = {"train": TRAIN, "test": EVAL, "predict": EVAL}


def backend_name() -> str:
    try:
        import keras

        return str(keras.backend.backend())
    except Exception:
        return "unknown"


def phases(backend: str, eager: bool) -> list[str]:
    """The phases a step of this backend records (the `loop` marker carries them; docs/accuracy.md)."""
    if backend == "torch":
        return ["data_wait", "forward", "backward", "optimizer"]
    out = ["data_wait"] if backend == "jax" else []
    return out + ["optimizer"] if eager else out


class KerasLoop:
    """Owned by the process's session while any Keras loop of it runs; `claim`/`release` nest (the zero-code
    wrapper around `fit`, the callback, `evaluate` inside `fit`)."""

    def __init__(self, session: Any, backend: str) -> None:
        self.session = session
        self.backend = backend
        self._claims = 0
        self._hooks_were: bool | None = None
        self._open = False
        self._optimizer: Any = None
        self._inputs_told: set[tuple[int, str]] = set()

    @property
    def tracker(self) -> Any:
        return self.session.tracker

    def claim(self, model: Any = None) -> None:
        self._claims += 1
        if self._claims > 1:
            return
        eager = bool(getattr(model, "run_eagerly", False))
        self.tracker.take_over(json.dumps({"by": "keras", "backend": self.backend, "eager": eager,
                                           "phases": phases(self.backend, eager)}))
        hooks = self.session.hooks
        if hooks is not None:  # the PyTorch hooks time phases inside Keras steps only
            self._hooks_were, hooks.enabled = bool(hooks.enabled), False
        if self.backend in ("jax", "tensorflow"):
            from stallwatch.keras import profilers

            self.session.windows.detailed_profiler = profilers.factory(self.backend)

    def release(self) -> None:
        if self._claims == 0:
            return
        self._claims -= 1
        if self._claims:
            return
        inputs.on_fetch = None
        self.end()
        self.unwrap_optimizer()
        self.tracker.hand_back()
        hooks = self.session.hooks
        if hooks is not None and self._hooks_were is not None:
            hooks.enabled = self._hooks_were
        self._hooks_were = None

    # -- a loop's course (the callback calls these) ---------------------------------------------------
    def loop_begins(self, kind: str, model: Any) -> None:
        """`fit` (kind "train"), `evaluate` ("test") or `predict` starts: its input is described once, its
        fetches timed, and in training the optimizer's apply timed where it runs eagerly."""
        inputs.on_fetch = self._fetched
        facts = dict(inputs.latest)
        if facts:
            key = (int(facts.get("loader_id") or 0), kind)
            if key not in self._inputs_told:
                self._inputs_told.add(key)
                t = now_us()
                facts["loop"] = kind
                self.session.sender.emit_tuple((DATALOADER, str(facts.get("dataset") or "keras"), t, t, "GLOBAL",
                                                None, self.session.pid, json.dumps(facts, default=str)))
        if kind == "train" and (self.backend == "torch" or getattr(model, "run_eagerly", False)):
            self.wrap_optimizer(getattr(model, "optimizer", None))

    def begin(self, kind: str) -> None:
        hooks = self.session.hooks
        if hooks is not None and self._hooks_were:
            hooks.enabled = True
        self._open = True
        self.tracker.begin_step(MODES[kind], STEP_NAMES[kind])

    def end(self) -> None:
        if not self._open:
            return
        self._open = False
        self.tracker.end_step()
        hooks = self.session.hooks
        if hooks is not None and self._hooks_were is not None:
            hooks.enabled = False

    def _fetched(self, t0: int, exhausted: bool) -> None:
        self.tracker.batch_end(KERAS_INPUT, t0, exhausted)

    # -- the optimizer --------------------------------------------------------------------------------
    def wrap_optimizer(self, optimizer: Any) -> None:
        """Time `optimizer.apply` (and JAX's eager `stateless_apply`) as the step's optimizer phase: wrapped on
        this instance only, undone when the loop ends."""
        if optimizer is None or self._optimizer is not None:
            return
        tracker, name = self.tracker, type(optimizer).__name__
        wrapped = []
        for method in ("apply", "stateless_apply"):
            original = getattr(optimizer, method, None)
            if original is None or method in vars(optimizer):
                continue

            def timed(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
                t0 = now_us()
                try:
                    return __original(*args, **kwargs)
                finally:
                    try:
                        tracker.optimizer(t0, now_us(), name)
                    except Exception as exc:
                        warn_once(f"keras-optimizer-{type(exc).__name__}", "stallwatch could not time the "
                                  "optimizer (%s: %s)", type(exc).__name__, exc)

            timed.__stallwatch_original__ = original  # type: ignore[attr-defined]
            object.__setattr__(optimizer, method, timed)
            wrapped.append(method)
        self._optimizer = (optimizer, wrapped)

    def unwrap_optimizer(self) -> None:
        if self._optimizer is None:
            return
        optimizer, wrapped = self._optimizer
        self._optimizer = None
        for method in wrapped:
            try:
                object.__delattr__(optimizer, method)
            except Exception:
                pass


_loops: dict[int, KerasLoop] = {}


def for_session(session: Any) -> KerasLoop:
    """The session's Keras loop (one per process's session)."""
    loop = _loops.get(id(session))
    if loop is None or loop.session is not session:
        _loops.clear()
        loop = _loops[id(session)] = KerasLoop(session, backend_name())
    return loop
