"""Callbacks for training frameworks (Lightning, Hugging Face Transformers): exact step boundaries where the
frameworks' own batch fetching (one batch ahead) would shift the automatic, DataLoader-delimited ones.

This package imports no framework: `stallwatch.integrations.lightning` and `.transformers` do, when used."""

from __future__ import annotations

import atexit
import os
from typing import Any

from stallwatch.collect.events import ENV_EVENTS
from stallwatch.log import logger, warn_once


def under_stallwatch_run() -> bool:
    """True inside a job started by `stallwatch run` (or a `profile()` block's children): a sampler listens."""
    return bool(os.environ.get(ENV_EVENTS))


class Recorder:
    """What every callback shares: joining the `stallwatch run` (or recording a run of its own), and step
    marks that never raise. `open_mode` is the mode of the step this recorder began and has not ended."""

    def __init__(self, out: str | None = None, *, torch_hooks: bool = True, **fields: Any) -> None:
        from stallwatch.torch.api import profile

        self._fields: dict[str, Any] = dict(fields, out=out) if out is not None else dict(fields)
        self._torch_hooks = torch_hooks  # False: a framework that does not run on PyTorch (Keras on JAX)
        profile(**self._fields)  # a bad setting raises here, when the callback is made, not during training
        self._profile: Any = None
        self.open_mode: str | None = None
        self._exit_registered = False

    @property
    def recording(self) -> bool:
        return self._profile is not None

    def start(self) -> None:
        """Join the run (under `stallwatch run`) or start recording one; already started: nothing."""
        if self._profile is not None:
            return
        try:
            from stallwatch.torch.api import profile

            own = not under_stallwatch_run()
            if not own and self._fields:
                warn_once("integration-fields", "the stallwatch callback's settings are ignored under "
                          "`stallwatch run`: the run's own configuration applies")
            prof = profile(torch_hooks=self._torch_hooks, **self._fields)
            prof.__enter__()
            self._profile = prof
            if own and not self._exit_registered:  # a framework that skips its end hooks on an error
                self._exit_registered = True     # leaves it to exit to finish the recording
                atexit.register(self.stop)
        except Exception as exc:  # RunConflictError included: the job trains on, unprofiled
            warn_once(f"integration-start-{type(exc).__name__}", "stallwatch could not start profiling from "
                      "the training callback (%s: %s); training goes on", type(exc).__name__, exc)

    def stop(self) -> None:
        """End the open step; a run this recorder started itself is finished."""
        prof, self._profile = self._profile, None
        self.open_mode = None
        if prof is None:
            return
        try:
            prof.__exit__(None, None, None)
        except Exception as exc:
            warn_once("integration-stop", "stallwatch could not stop profiling cleanly (%s: %s)",
                      type(exc).__name__, exc)

    def tracker(self) -> Any:
        """The process's step tracker, None when not profiling."""
        if self._profile is None:
            return None
        from stallwatch.torch.session import current

        session = current()
        return session.tracker if session is not None else None

    def begin(self, mode: str) -> None:
        """A step of `mode` begins now (ending any open one); batches fetched since the last end are its wait."""
        try:
            tracker = self.tracker()
            if tracker is not None:
                tracker.begin_step(mode)
                self.open_mode = mode
        except Exception as exc:
            _failed("begin", exc)

    def stop_requested(self) -> bool:
        """Training was asked to stop (a rule's stop_training action, `stallwatch config --stop-training`)."""
        try:
            from stallwatch.torch.session import current

            session = current()
            return session is not None and session.stop_reason is not None
        except Exception:
            return False

    def end(self, mode: str | None = None) -> None:
        """End the open step (only one of `mode`, when given)."""
        if self.open_mode is None or (mode is not None and self.open_mode != mode):
            return
        self.open_mode = None
        try:
            tracker = self.tracker()
            if tracker is not None:
                tracker.end_step()
        except Exception as exc:
            _failed("end", exc)

    def set_hooks_enabled(self, enabled: bool) -> bool | None:
        """Switch the PyTorch hooks on or off (e.g. around Lightning's sanity check); returns the old value."""
        try:
            from stallwatch.torch.session import current

            session = current() if self._profile is not None else None
            hooks = getattr(session, "hooks", None)
            if hooks is None:
                return None
            old = bool(hooks.enabled)
            hooks.enabled = enabled
            return old
        except Exception as exc:
            _failed("hooks", exc)
            return None


def _failed(what: str, exc: Exception) -> None:
    if not warn_once(f"integration-{what}-{type(exc).__name__}", "stallwatch's training callback failed to "
                     "mark a step (%s: %s); training goes on", type(exc).__name__, exc):
        logger.debug("stallwatch callback %s failed again: %s", what, exc)
