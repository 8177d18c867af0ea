"""The explicit API: a context manager that profiles a block of training code, with exact step marks."""

from __future__ import annotations

import os
import sys
from typing import Any

from stallwatch.collect.events import ENV_EVENTS
from stallwatch.config import ProfilerConfig
from stallwatch.log import logger, warn_once
from stallwatch.records import EVAL, GLOBAL, TRAIN

_MODES = {"train": TRAIN, "training": TRAIN, "eval": EVAL, "evaluation": EVAL, "validation": EVAL, "val": EVAL,
          "test": EVAL, "predict": EVAL, "inference": EVAL, "global": GLOBAL}


def mode_name(mode: str | None) -> str | None:
    """"train", "eval", "validation"… (any case) as TRAIN / EVAL / GLOBAL; None lets the hooks decide."""
    if mode is None:
        return None
    try:
        return _MODES[str(mode).lower()]
    except KeyError:
        raise ValueError(f"unknown step mode {mode!r}: use 'train', 'eval' or 'global'") from None


class _StepMark:
    """What `prof.step()` returns: already begun; as a context manager, its exit ends the step."""

    def __init__(self, profile: Profile) -> None:
        self._profile = profile

    def __enter__(self) -> _StepMark:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._profile._call("end_step")


class Profile:
    """Profiles the process while entered. Under `stallwatch run` it joins that run; otherwise it creates
    a run (`out`, or a new one under `runs_dir`) and samples this machine until exit."""

    def __init__(self, config: ProfilerConfig | None = None, *, torch_hooks: bool = True, **fields: Any) -> None:
        base = config or ProfilerConfig()
        self._torch_hooks = torch_hooks  # False: no PyTorch hooks (a Keras job on JAX or TensorFlow)
        self.config = base.replace(**fields) if fields else base  # a bad field raises here, before any work
        self.run_uri: str | None = os.environ.get("STALLWATCH_RUN")
        self._node: Any = None
        self._private_dirs: Any = None
        self._session: Any = None
        self._saved_env: dict[str, str | None] = {}
        self._ran: list[dict[str, Any]] = []  # the windows of a session that has ended

    def __enter__(self) -> Profile:
        try:
            self._start()
        except Exception as exc:  # profiling must never stop the training code
            if type(exc).__name__ == "RunConflictError":
                raise
            warn_once("profile-start", "stallwatch profiling is off (%s: %s)", type(exc).__name__, exc)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._stop(failed=exc[0] is not None)
        except Exception as err:
            warn_once("profile-stop", "stallwatch could not finish profiling cleanly (%s: %s)", type(err).__name__, err)

    def step(self, mode: str | None = "train") -> _StepMark:
        """Mark the start of a step (ending the previous one). Use it as a statement at the top of each
        iteration, or as `with prof.step("eval"):` around the step's body for an exact end."""
        self._call("begin_step", mode_name(mode))
        return _StepMark(self)

    @property
    def should_stop(self) -> bool:
        """True once training was asked to stop (a rule's stop_training action, `stallwatch config RUN
        --stop-training`): loops over a DataLoader end by themselves; check this in any other loop."""
        session = self._session
        return session is not None and session.stop_reason is not None

    @property
    def windows(self) -> list[dict[str, Any]]:
        """The profiling windows that ran in this process (detailed, python, dataloader)."""
        return list(self._session.windows.windows) if self._session is not None else list(self._ran)

    def _call(self, method: str, *args: Any) -> None:
        session = self._session
        if session is None:
            return
        try:
            getattr(session.tracker, method)(*args)
        except Exception as exc:
            warn_once(f"profile-{method}", "stallwatch step mark failed (%s: %s)", type(exc).__name__, exc)

    def _start(self) -> None:
        from stallwatch.torch import session as sessions

        if not os.environ.get(ENV_EVENTS):
            self._start_node()
        self._session = sessions.install(self.config if self._node is not None else None, self._torch_hooks)

    def _start_node(self) -> None:
        from stallwatch.collect.launcher import PrivateDirs, start_node

        self._private_dirs = PrivateDirs.make()
        self._node = start_node([sys.executable, *sys.argv], self.config, self._private_dirs)
        self.run_uri = self._node.run_uri
        if self._node.sampler is None:
            return
        self._node.sampler.send('{"pid": %d}' % os.getpid())
        env = self._node.job_environment()
        for name in ("STALLWATCH_RUN", "STALLWATCH_NODE", "STALLWATCH_RUN_ID", "STALLWATCH_EVENTS",
                     "STALLWATCH_EVENTS_ACKS", "STALLWATCH_STAGING", "STALLWATCH_CONFIG"):
            if name in env:  # workers and child processes find the sampler too
                self._saved_env[name] = os.environ.get(name)
                os.environ[name] = env[name]
        logger.info("stallwatch: recording run %s", self.run_uri)

    def _stop(self, failed: bool = False) -> None:
        from stallwatch.timeutil import now_us

        if self._node is None:
            if self._session is not None:
                self._session.tracker.end_step()
            return
        from stallwatch.torch import session as sessions

        if self._session is not None:
            self._ran = self._session.windows.windows
        sessions.uninstall()
        self._session = None
        self._node.finish(1 if failed else 0, now_us())  # the block raised: recorded as a failed run
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self._private_dirs is not None:
            self._private_dirs.remove()
        self._node = None


def profile(config: ProfilerConfig | None = None, *, torch_hooks: bool = True, **fields: Any) -> Profile:
    """`with stallwatch.torch.profile(out="runs/x", detailed_profiling="5:1") as prof:` (fields as in
    ProfilerConfig; ranges may be given as "START:NUM" strings)."""
    for name in ("detailed_profiling", "dataloader_profiling", "python_profiling", "memory_profiling"):
        if isinstance(fields.get(name), str):
            from stallwatch.config import ProfilingRange

            fields[name] = ProfilingRange.parse(name, fields[name])
    return Profile(config, torch_hooks=torch_hooks, **fields)
