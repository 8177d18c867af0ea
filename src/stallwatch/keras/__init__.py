"""Keras 3 profiling, on the torch, JAX and TensorFlow backends: automatic under `stallwatch run`, or explicit
with the callback.

    model.fit(x, y, validation_data=(xv, yv), callbacks=[stallwatch.keras.ProfilerCallback()])

Each training batch is a TRAIN step; each validation batch of `fit` and each `evaluate` batch an EVAL step
(named test_step); each `predict` batch an EVAL step named predict_step (the store knows TRAIN, EVAL and
GLOBAL). Outside `stallwatch run` the callback records a run of its own (settings as in
`stallwatch.torch.profile()`). Importing this package imports no Keras: `ProfilerCallback` is made on first use."""

from __future__ import annotations

from typing import Any

__all__ = ["ProfilerCallback"]


def __getattr__(name: str) -> Any:
    if name == "ProfilerCallback":
        from stallwatch.keras.callback import ProfilerCallback

        globals()[name] = ProfilerCallback
        return ProfilerCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
