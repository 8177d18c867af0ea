"""Lightning callback: each batch of a training, validation, test or predict loop is one exact step, since
Lightning's data fetcher asks for batches outside the step that uses them.

    trainer = lightning.pytorch.Trainer(callbacks=[StallwatchCallback()])                 # under `stallwatch run`
    trainer = lightning.pytorch.Trainer(callbacks=[StallwatchCallback(out="runs/exp1")])  # records a run itself

Steps: a training batch (`on_train_batch_start` to `on_train_batch_end`) is a TRAIN step, so with
`accumulate_grad_batches=N` only every Nth step has an optimizer phase; validation, test and predict batches
are EVAL steps. The sanity check's validation batches are not steps: the PyTorch hooks are off during it, so
it records nothing (its batches would otherwise count as EVAL steps the user never asked for).

Recording: under `stallwatch run` the callback joins that run; otherwise it records a run of its own from
the trainer call's `setup` to its `teardown` (settings as in `stallwatch.torch.profile()`; a fixed `out`
holds one recording, so a second trainer call with the same callback is not recorded, said once).

`StallwatchCallback` subclasses the `lightning.pytorch` Callback, or the `pytorch_lightning` one where only
that package is installed or already imported; `callback_class("pytorch_lightning")` gives that one
explicitly. The trainer's global_step is not recorded: step events carry no args of the callback's."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from typing import Any

from stallwatch.integrations import Recorder, under_stallwatch_run
from stallwatch.log import warn_once
from stallwatch.records import EVAL, TRAIN

PACKAGES = ("lightning.pytorch", "pytorch_lightning")
_classes: dict[str, type] = {}


class _LightningMarks:
    """The callback's behaviour, independent of which Lightning package its base class comes from."""

    def __init__(self, out: str | None = None, **fields: Any) -> None:
        super().__init__()
        self.recorder = Recorder(out, **fields)
        self._hooks_were: bool | None = None
        self._stage: str | None = None

    # -- lifetime -------------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str | None = None) -> None:
        if not self.recorder.recording:
            self._stage = str(stage)
            self.recorder.start()

    def teardown(self, trainer: Any, pl_module: Any, stage: str | None = None) -> None:
        self._restore_hooks()
        if self._stage is None or self._stage == str(stage):
            self._stage = None
            self.recorder.stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Lightning skips `teardown` after an exception: the recording stops here."""
        self._restore_hooks()
        self._stage = None
        self.recorder.stop()

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self.recorder.end()
        self._hooks_were = self.recorder.set_hooks_enabled(False)

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._restore_hooks()

    def _restore_hooks(self) -> None:
        if self._hooks_were is not None:
            self.recorder.set_hooks_enabled(self._hooks_were)
            self._hooks_were = None

    # -- steps ----------------------------------------------------------------------------------------
    def on_train_batch_start(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self.recorder.begin(TRAIN)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self.recorder.end(TRAIN)
        if self.recorder.stop_requested():
            trainer.should_stop = True  # Lightning ends the fit gracefully (checkpointing hooks still run)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.recorder.end(TRAIN)

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            self.recorder.begin(EVAL)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self.recorder.end(EVAL)

    def on_test_batch_start(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self.recorder.begin(EVAL)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self.recorder.end(EVAL)

    def on_predict_batch_start(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self.recorder.begin(EVAL)

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self.recorder.end(EVAL)


def _guarded(cls: type) -> type:
    """Every Lightning hook of the class, made unable to raise into training."""
    for name, fn in list(vars(_LightningMarks).items()):
        if name.startswith(("on_", "setup", "teardown")) and callable(fn):
            setattr(cls, name, _never_raises(fn))
    return cls


def _never_raises(fn: Any) -> Any:
    @functools.wraps(fn)
    def hook(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(self, *args, **kwargs)
        except Exception as exc:
            warn_once(f"lightning-{fn.__name__}", "stallwatch's Lightning callback failed in %s (%s: %s); "
                      "training goes on", fn.__name__, type(exc).__name__, exc)
    return hook


def callback_class(package: str = "lightning.pytorch") -> type:
    """The callback class for one Lightning package ("lightning.pytorch" or "pytorch_lightning")."""
    if package not in _classes:
        base = importlib.import_module(f"{package}.callbacks").Callback
        doc = f"Marks Lightning batches as stallwatch steps ({package}); see {__name__} for which and when."
        cls = type("StallwatchCallback", (_LightningMarks, base), {"__module__": __name__, "__doc__": doc})
        _classes[package] = _guarded(cls)
    return _classes[package]


def _default_package() -> str:
    """The package the user's code uses: the one already imported, else the one installed (new name first)."""
    for package in PACKAGES:
        if package in sys.modules:
            return package
    for package in PACKAGES:
        try:
            if importlib.util.find_spec(package.partition(".")[0]) is not None:
                return package
        except (ImportError, ValueError):
            continue
    raise ImportError("stallwatch's Lightning callback needs `lightning` or `pytorch_lightning` installed")


def __getattr__(name: str) -> Any:
    """`StallwatchCallback` is made on first use, so that importing this module imports no Lightning."""
    if name == "StallwatchCallback":
        cls = callback_class(_default_package())
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- zero-code registration ---------------------------------------------------------------------------
def auto_register() -> None:
    """Under `stallwatch run`: every Trainer of an imported Lightning package gets the callback, unless the
    user gave one. Run right after `lightning.pytorch` / `pytorch_lightning` is imported (autoload)."""
    for package in PACKAGES:
        module = sys.modules.get(package)
        trainer_cls = getattr(module, "Trainer", None) if module is not None else None
        if trainer_cls is None or getattr(trainer_cls.__init__, "__stallwatch_original__", None) is not None:
            continue
        trainer_cls.__init__ = _patched_init(trainer_cls.__init__, package)


def _patched_init(original: Any, package: str) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            if under_stallwatch_run():
                kwargs["callbacks"] = _with_ours(kwargs.get("callbacks"), package)
        except Exception as exc:
            warn_once("lightning-auto-register", "stallwatch could not add its Lightning callback (%s: %s)",
                      type(exc).__name__, exc)
        original(self, *args, **kwargs)

    __init__.__stallwatch_original__ = original  # type: ignore[attr-defined]
    return __init__


def _with_ours(callbacks: Any, package: str) -> Any:
    given = [] if callbacks is None else [callbacks] if not isinstance(callbacks, (list, tuple)) else list(callbacks)
    if any(isinstance(cb, _LightningMarks) for cb in given):
        return callbacks
    return [*given, callback_class(package)()]
