"""Zero-code Keras profiling under `stallwatch run`: run right after the job imports `keras` (the launcher's
start-up code watches for it, as for torch). Every `fit`, `evaluate` and `predict` then gets a
ProfilerCallback (unless the job passed one), and the Keras loop owns the steps from before the call starts
(Keras builds the model on a first batch before its callbacks begin: that is not a step)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from stallwatch.integrations import under_stallwatch_run
from stallwatch.log import warn_once

METHODS = ("fit", "evaluate", "predict")


def install() -> None:
    if not under_stallwatch_run():
        return
    import keras

    from stallwatch.keras import inputs
    from stallwatch.keras.loop import backend_name
    from stallwatch.torch import session as sessions

    backend = backend_name()
    sessions.install(torch_hooks=backend == "torch")  # torch's own import hook made it already on torch
    inputs.patch_epoch_iterator(time_fetches=backend != "tensorflow")
    model_cls = keras.Model
    for name in METHODS:
        original = getattr(model_cls, name)
        if getattr(original, "__stallwatch_original__", None) is None:
            setattr(model_cls, name, _wrapped(original))


def _wrapped(original: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        loop = None
        try:
            args, kwargs = _with_callback(signature, self, args, kwargs)
            loop = _claim(self)
        except Exception as exc:
            warn_once(f"keras-autoload-{type(exc).__name__}", "stallwatch could not profile a Keras %s (%s: %s); "
                      "it runs unprofiled", original.__name__, type(exc).__name__, exc)
        try:
            return original(self, *args, **kwargs)
        finally:
            if loop is not None:
                try:
                    loop.release()
                except Exception as exc:
                    warn_once("keras-release", "stallwatch could not end a Keras loop cleanly (%s: %s)",
                              type(exc).__name__, exc)

    method.__stallwatch_original__ = original  # type: ignore[attr-defined]
    return method


def _claim(model: Any) -> Any:
    from stallwatch.keras.loop import for_session
    from stallwatch.torch.session import current

    session = current()
    if session is None:
        return None
    loop = for_session(session)
    loop.claim(model)
    return loop


def _with_callback(signature: inspect.Signature, model: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call's arguments with a ProfilerCallback added to `callbacks` (left as they are when the job gave
    one, or gave a CallbackList of its own: Keras passes fit's to its validation `evaluate` that way)."""
    from stallwatch.keras.callback import ProfilerCallback

    bound = signature.bind(model, *args, **kwargs)
    given = bound.arguments.get("callbacks")
    if given is not None and not isinstance(given, (list, tuple)):
        inner = getattr(given, "callbacks", None)
        if not isinstance(inner, list) or not any(isinstance(cb, ProfilerCallback) for cb in inner):
            warn_once("keras-callback-list", "a Keras loop given a CallbackList of its own is not profiled "
                      "step by step: add stallwatch.keras.ProfilerCallback() to it")
        return args, kwargs
    callbacks = list(given or [])
    if any(isinstance(cb, ProfilerCallback) for cb in callbacks):
        return args, kwargs
    bound.arguments["callbacks"] = [*callbacks, ProfilerCallback()]
    return tuple(bound.args[1:]), dict(bound.kwargs)
