"""One profiling session per training process: the configuration in force, the step tracker, the hooks,
the profiling windows and the channel to the sampler. Live configuration arrives from the sampler on the
sender's thread and is applied by the training thread at the next step boundary."""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any

from stallwatch.collect.events import ENV_CONFIG, ENV_STAGING, EventSender, reset_sender, sender_from_env
from stallwatch.config import ConfigError, ProfilerConfig
from stallwatch.log import logger, warn_once
from stallwatch.records import OVERHEAD, TRAIN
from stallwatch.torch.sampling import StepSampling
from stallwatch.torch.steps import StepTracker, now_us
from stallwatch.torch.windows import WindowController

OVERHEAD_EVERY_S = 60.0  # the hooks' measured cost is recorded this often (and at exit): a killed job keeps most


class Session:
    def __init__(self, config: ProfilerConfig, sender: EventSender | None, staging: str | None) -> None:
        self.pid = os.getpid()
        self.config = config
        self.sender = sender
        self._new_config: ProfilerConfig | None = None  # set by the sender's thread, taken by the training thread
        emit = sender.emit_tuple if sender is not None else _drop
        send = sender.send_message if sender is not None else _drop
        self.windows = WindowController(config, pid=self.pid, staging=staging, emit=emit, send=send)
        self.tracker = StepTracker(emit, self.pid, listener=self)
        self.hooks: Any = None
        self.sampling: StepSampling | None = None
        self._closed = False
        self._overhead_at = time.monotonic() + OVERHEAD_EVERY_S

    def install_hooks(self) -> None:
        from stallwatch.torch.hooks import TorchHooks

        emit = self.sender.emit_tuple if self.sender is not None else _drop
        self.hooks = TorchHooks(self.tracker, emit, self.pid)
        self.hooks.on_discovery = self.refresh_listener
        if self.sender is not None:
            self.sender.on_tick = self._tick
        try:
            self.hooks.install()
        except Exception as exc:
            logger.warning("stallwatch could not hook into PyTorch (%s: %s); only system metrics are recorded",
                           type(exc).__name__, exc)
            self.hooks.uninstall()
            self.hooks = None
            return
        if self.config.sample_steps_above_per_s:
            self.sampling = StepSampling(self.config.sample_steps_above_per_s, self.tracker, self.hooks)

    # -- the tracker's listener (training thread) -----------------------------------------------------
    def on_step_begin(self, mode: str, step: int, now_us: int) -> None:
        new = self._new_config
        if new is not None:
            self._new_config = None
            self.config = new
            self.windows.set_config(new, self.tracker.counts[TRAIN])
            if new.stop_training and self.hooks is not None and self.hooks.stop_reason is None:
                self.request_stop(new.stop_training)
        self.windows.on_step_begin(mode, step, now_us)
        self.refresh_listener()

    def on_step_end(self, mode: str, step: int, start_us: int, end_us: int) -> None:
        self.windows.on_step_end(mode, step, start_us, end_us)
        if self.hooks is not None:
            self.hooks.step_ended()
        self.refresh_listener()

    @property
    def stop_reason(self) -> str | None:
        return self.hooks.stop_reason if self.hooks is not None else None

    def request_stop(self, reason: str) -> None:
        """Training stops at the next step boundary: every DataLoader then reports its end (the loops end
        as at the end of the data), the callbacks tell Lightning and Transformers to stop; recorded."""
        if self.hooks is None or self.hooks.stop_reason is not None:
            return
        self.hooks.stop_reason = reason
        from stallwatch.torch.steps import now_us

        t = now_us()
        logger.warning("stallwatch: stopping training at the next step boundary: %s", reason)
        if self.sender is not None:
            self.sender.emit_tuple(("stop", "stop_training", t, t, "GLOBAL", None, self.pid,
                                    json.dumps({"reason": reason, "train_steps": self.tracker.counts[TRAIN]})))

    def refresh_listener(self) -> None:
        """Step boundaries reach this session only while something needs them (a window to open or
        close, the model still being looked for, DDP timings, a new configuration): most steps of a long
        run cost the tracker alone."""
        hooks = self.hooks
        needed = (not self.windows.idle or self._new_config is not None
                  or (hooks is not None and hooks.needs_steps))
        self.tracker.listener = self if needed else None

    # -- the hooks' own cost (sender thread, and at exit) ---------------------------------------------
    def _tick(self) -> None:
        hooks = self.hooks
        if hooks is None:
            return
        hooks.probe.tick()
        now = time.monotonic()
        if now >= self._overhead_at:
            self._overhead_at = now + OVERHEAD_EVERY_S
            self._record_overhead()

    def _record_overhead(self) -> None:
        """The hooks' measured time so far, cumulative (the newest record of a process is its total)."""
        probe = self.hooks.probe if self.hooks is not None else None
        if probe is None or self.sender is None or not probe.window_ns:
            return
        t = now_us()  # a moment (the totals so far), not a span: the timeline draws it as an instant
        self.sender.emit_tuple((OVERHEAD, "hooks", t, t, "GLOBAL", None, self.pid,
                                json.dumps({"own_ns": probe.own_ns, "window_ns": probe.window_ns,
                                            "calls": probe.calls, "sender_ns": probe.sender_ns})))

    # -- from the sampler (sender thread) -------------------------------------------------------------
    def on_message(self, message: dict[str, Any]) -> None:
        data = message.get("config")
        if not isinstance(data, dict):
            return
        try:
            config = ProfilerConfig.from_dict(data)
        except (ConfigError, TypeError) as exc:  # the sampler validated it; refuse anyway, keep the old one
            warn_once("live-config-bad", "ignoring a live configuration that does not validate (%s)", exc)
            return
        if config != self.config:
            self._new_config = config
            self.tracker.listener = self  # applied at the next step boundary

    def close(self) -> None:
        if self._closed or self.pid != os.getpid():  # a forked child's copy: the parent's to close
            return
        self._closed = True
        try:
            if self.sender is not None:  # an uncaught allocation failure: the memory state, before it is gone
                from stallwatch.torch.oom import record_at_exit

                record_at_exit(self.sender.emit_tuple, self.pid, self.tracker.counts[TRAIN])
        except Exception as exc:
            warn_once("session-oom", "stallwatch could not record the memory state (%s: %s)", type(exc).__name__, exc)
        try:
            if self.sampling is not None:
                self.sampling.stop()
            self.tracker.finish()
            self.tracker.close()
            if self.sampling is not None:
                self.sampling.close()
            self.windows.close()
            if self.hooks is not None:
                self.hooks.record_ddp_stats()
                self.hooks.probe.finish(by_ticker=False)
                self._record_overhead()
        except Exception as exc:
            warn_once("session-close", "stallwatch could not finish its last step (%s: %s)", type(exc).__name__, exc)
        if self.hooks is not None:
            self.hooks.enabled = False
        if self.sender is not None:
            self.sender.close()


def _drop(_item: Any) -> None:
    return None


_session: Session | None = None
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child (a data-loader worker) records nothing through its parent's session: its hooks
    would only fill a queue that no thread sends."""
    global _lock
    _lock = threading.Lock()
    if _session is not None and _session.hooks is not None:
        _session.hooks.enabled = False
        _session.hooks.probe.on = False  # a window open at the fork would stay open: nothing here closes it


os.register_at_fork(after_in_child=_after_fork_in_child)


def current() -> Session | None:
    return _session if _session is not None and _session.pid == os.getpid() else None


def install(config: ProfilerConfig | None = None, torch_hooks: bool = True) -> Session | None:
    """The process's session, created (and PyTorch hooked, unless `torch_hooks` is False: a Keras job on JAX
    or TensorFlow imports no torch) on first call; None when not under a sampler. Never raises: a failure
    leaves the job running without framework events (said once)."""
    global _session
    try:
        with _lock:
            if current() is not None:
                return _session
            if config is None:
                config = config_from_env()
            sender = sender_from_env()
            if sender is None:
                return None
            session = Session(config, sender, os.environ.get(ENV_STAGING))
            sender.on_message = session.on_message
            if torch_hooks:
                session.install_hooks()
            if config.stop_training:
                session.request_stop(config.stop_training)
            _session = session
            # Flushed at exit; never through a signal handler: a handler would change how the job dies
            # (late, or not at all, while it is inside native code). A job killed outright loses at most
            # the events of its last send interval.
            atexit.register(session.close)
            return session
    except Exception as exc:
        warn_once("session-install", "stallwatch framework profiling is off (%s: %s)", type(exc).__name__, exc)
        return None


def config_from_env() -> ProfilerConfig:
    text = os.environ.get(ENV_CONFIG)
    if not text:
        return ProfilerConfig()
    try:
        return ProfilerConfig.from_dict(json.loads(text))
    except (ValueError, TypeError) as exc:
        warn_once("env-config", "ignoring an invalid %s (%s); profiling windows are off", ENV_CONFIG, exc)
        return ProfilerConfig()


def uninstall() -> None:
    """Unhook and forget the session (tests; a user who wants stallwatch out of the process)."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        session.close()
        if session.hooks is not None:
            session.hooks.uninstall()
        reset_sender()
