"""Profiling windows: torch.profiler (detailed), cProfile or pyinstrument (python) and batch-fetch timing
(dataloader), each switched on and off at step boundaries for the configured steps or time window.

Step ranges count TRAIN steps. What a window produces is staged in a private local directory and handed
to the sampler, which stores and summarises it: the training thread pays only for the profiler itself."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from stallwatch.config import MAX_DETAILED_STEPS, ProfilerConfig, ProfilingRange
from stallwatch.log import logger, warn_once
from stallwatch.records import GLOBAL, TRAIN
from stallwatch.torch import dataloader as dl
from stallwatch.torch.steps import now_us

DETAILED, PYTHON, DATALOADER, MEMORY = "detailed", "python", "dataloader", "memory"
LAYERS = (DETAILED, PYTHON, DATALOADER, MEMORY)  # memory: where memory grows (torch/memory_capture.py)
PROFILING = "profiling"  # the framework-event kind that marks a window


class _Profiler:
    """One layer's profiler for one window; `stop()` returns {stored name: staged path}."""

    files: dict[str, str]

    def start(self, first_step: int) -> None: ...
    def stop(self, folder: str) -> dict[str, str]: ...
    meta: dict[str, Any] = {}

    def next_step(self) -> None:
        """A new step began inside the window."""


class _TorchProfiler(_Profiler):
    def __init__(self) -> None:
        import torch

        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.meta = {"profiler": "torch.profiler", "activities": [a.name.lower() for a in acts]}
        record = torch.profiler.ProfilerAction.RECORD  # a schedule (always recording) marks each step
        self._prof = torch.profiler.profile(activities=acts, record_shapes=True, schedule=lambda _step: record)

    def start(self, first_step: int) -> None:
        import torch

        if torch._C._autograd._profiler_enabled():  # starting ours would end the user's own session
            raise RuntimeError("torch.profiler is already running in this process")
        # ProfilerStep#N annotations numbered as the job's steps: Perfetto shows them, HTA needs them.
        self._prof.step_num = first_step
        self._prof.start()

    def next_step(self) -> None:
        self._prof.step()

    def stop(self, folder: str) -> dict[str, str]:
        self._prof.stop()
        path = os.path.join(folder, "trace.json")
        self._prof.export_chrome_trace(path)
        return {"trace.json": path}


class _CProfile(_Profiler):
    def __init__(self, timer: str) -> None:
        import cProfile
        import time

        timers: dict[str, Callable[[], float] | None] = {
            "total": None,  # cProfile's own wall clock: the cheapest
            "cpu": time.process_time,
            "off_cpu": lambda: time.perf_counter() - time.process_time(),
        }
        chosen = timers[timer]
        self._prof = cProfile.Profile() if chosen is None else cProfile.Profile(chosen)
        self.meta = {"profiler": "cprofile", "timer": timer}

    def start(self, first_step: int) -> None:
        _no_other_python_profiler()
        self._prof.enable()

    def stop(self, folder: str) -> dict[str, str]:
        self._prof.disable()
        path = os.path.join(folder, "profile.pstats")
        self._prof.dump_stats(path)
        return {"profile.pstats": path}


class _Pyinstrument(_Profiler):
    def __init__(self) -> None:
        from pyinstrument import Profiler

        self._prof = Profiler(interval=0.001, async_mode="disabled")
        self.meta = {"profiler": "pyinstrument", "timer": None}

    def start(self, first_step: int) -> None:
        _no_other_python_profiler()
        self._prof.start()

    def stop(self, folder: str) -> dict[str, str]:
        session = self._prof.stop()
        path = os.path.join(folder, "pyinstrument.json")
        session.save(path)
        return {"pyinstrument.json": path}


class _DataloaderTiming(_Profiler):
    meta = {"profiler": "fetch timing"}

    def start(self, first_step: int) -> None:
        dl.set_profiling(True)

    def stop(self, folder: str) -> dict[str, str]:
        dl.set_profiling(False)
        return {}


def _no_other_python_profiler() -> None:
    import sys

    if sys.getprofile() is not None:  # replacing it would silently break the user's own profiler
        raise RuntimeError("another Python profiler is already running in this thread")


def _make(layer: str, config: ProfilerConfig, detailed: Callable[[], _Profiler] | None = None,
          emit: Callable[[tuple], None] | None = None, pid: int = 0) -> _Profiler:
    if layer == MEMORY:
        from stallwatch.torch.memory_capture import MemoryCapture

        return MemoryCapture(emit or (lambda _e: None), pid)  # type: ignore[return-value]
    if layer == DETAILED:
        return detailed() if detailed is not None else _TorchProfiler()
    if layer == DATALOADER:
        return _DataloaderTiming()
    if config.python_profiler == "pyinstrument":
        return _Pyinstrument()
    return _CProfile(config.cprofile_timer)


@dataclass
class _Window:
    layer: str
    range: ProfilingRange
    profiler: _Profiler
    start_us: int
    steps: list[int] = field(default_factory=list)
    stepped: int = 1  # steps begun inside the window (the first one opened it)

    @property
    def name(self) -> str:
        return f"{self.layer}-{self.start_us:016d}"


class WindowController:
    """Consulted at every step boundary; with nothing configured it costs one loop over three Nones."""

    def __init__(self, config: ProfilerConfig, *, pid: int, staging: str | None,
                 emit: Callable[[tuple], None], send: Callable[[dict[str, Any]], None]) -> None:
        self.config = config
        self.pid = pid
        self._staging = staging
        self._emit = emit
        self._send = send
        self._active: dict[str, _Window] = {}
        self._done: set[tuple[str, ProfilingRange]] = set()  # each configured window runs once
        self.windows: list[dict[str, Any]] = []  # what ran, for tests and the end-of-run summary
        self.idle = False  # nothing configured to start and nothing open: step boundaries cost one check
        # Detailed windows use torch.profiler unless a framework integration names its backend's profiler
        # (Keras on JAX or TensorFlow: stallwatch.keras.profilers).
        self.detailed_profiler: Callable[[], _Profiler] | None = None
        self._update_idle()

    def _update_idle(self) -> None:
        pending = any((rng := getattr(self.config, f"{layer}_profiling")) is not None and (layer, rng) not in self._done
                      for layer in LAYERS)
        self.idle = not pending and not self._active

    def set_config(self, config: ProfilerConfig, train_steps_done: int) -> None:
        """A new configuration (live): applies from the next step. A window that will never run is said so:
        a step or time window already past, or one that ran already (each configured window runs once)."""
        now = now_us()
        for layer in LAYERS:
            rng = getattr(config, f"{layer}_profiling")
            if rng == getattr(self.config, f"{layer}_profiling") or rng is None:
                continue
            if (layer, rng) in self._done:
                self._refuse(layer, rng, "ran_already", f"{layer}_profiling {rng.to_spec()} ran already in this "
                             "job (each window runs once); give another range to profile again")
            elif rng.by_steps and rng.start_step + rng.num_steps <= train_steps_done:
                self._refuse(layer, rng, "past", f"{layer}_profiling {rng.to_spec()} is already past "
                             f"({train_steps_done} training steps done); nothing to profile")
            elif not rng.by_steps and _time_end(rng) <= now:
                self._refuse(layer, rng, "past", f"{layer}_profiling {rng.to_spec()} is already past (it ended "
                             f"{(now - _time_end(rng)) / 1e6:.0f} s ago); nothing to profile")
        self.config = config
        self._update_idle()

    def on_step_begin(self, mode: str, step: int, now: int) -> None:
        if self.idle:
            return
        config = self.config
        for layer in LAYERS:
            active = self._active.get(layer)
            if active is not None:
                if not active.range.by_steps and now >= _time_end(active.range):
                    self._stop(active, "complete")
                elif layer == DETAILED and active.stepped >= MAX_DETAILED_STEPS:
                    logger.warning("detailed profiling stopped after %d steps, the most one window may hold "
                                   "(torch.profiler keeps every event in the job's memory); profile a shorter "
                                   "window to see all of it", active.stepped)
                    self._stop(active, "capped")
                elif getattr(active.profiler, "done", False):  # a memory capture that has its two snapshots
                    self._stop(active, "complete")
                else:
                    active.profiler.next_step()
                    active.stepped += 1
                continue
            rng = getattr(config, f"{layer}_profiling")
            if rng is None or (layer, rng) in self._done:
                continue
            if rng.by_steps:
                due = mode == TRAIN and rng.start_step <= step < rng.start_step + rng.num_steps
            else:
                due = rng.start_time_us <= now < _time_end(rng)
                if now >= _time_end(rng):
                    self._done.add((layer, rng))
            if due:
                self._start(layer, rng, config, now, step)
        self._update_idle()

    def on_step_end(self, mode: str, step: int, start_us: int, end_us: int) -> None:
        if not self._active:
            return
        for window in list(self._active.values()):
            rng = window.range
            if rng.by_steps:
                if mode == TRAIN and rng.start_step <= step < rng.start_step + rng.num_steps:
                    window.steps.append(step)
                if mode == TRAIN and step >= rng.start_step + rng.num_steps - 1:
                    self._stop(window, "complete")
            elif end_us >= _time_end(rng):
                self._stop(window, "complete")
        self._update_idle()

    def close(self) -> None:
        """At exit: a window still open is stopped and kept, marked as cut short."""
        for window in list(self._active.values()):
            self._stop(window, "cut_short")

    def _start(self, layer: str, rng: ProfilingRange, config: ProfilerConfig, now: int, step: int) -> None:
        self._done.add((layer, rng))
        if layer != DATALOADER and not self._staging:
            warn_once(f"no-staging-{layer}", "%s profiling needs `stallwatch run` or stallwatch.torch.profile(); "
                      "skipped", layer)
            self._notify(layer, rng, "failed", f"{layer} profiling needs `stallwatch run` or "
                         "stallwatch.torch.profile(); skipped")
            return
        try:
            profiler = _make(layer, config, self.detailed_profiler, self._emit, self.pid)
            profiler.start(step)
        except Exception as exc:  # another profiler already running, pyinstrument not installed…
            logger.warning("cannot start %s profiling (%s: %s); training goes on without it",
                           layer, type(exc).__name__, exc)
            self._notify(layer, rng, "failed", f"cannot start {layer} profiling ({type(exc).__name__}: "
                         f"{str(exc)[:200]})")
            return
        window = self._active[layer] = _Window(layer, rng, profiler, now)
        # its beginning, at once: a rule evaluated while it runs knows the profiler's memory is in the steps
        self._emit((PROFILING, layer, now, now, GLOBAL, None, self.pid,
                    json.dumps({"window": window.name, "status": "started"})))
        self._notify(layer, rng, "started", f"{layer} profiling started at step {step}")

    def _refuse(self, layer: str, rng: ProfilingRange, outcome: str, message: str) -> None:
        logger.warning("%s", message)
        self._notify(layer, rng, outcome, message)

    def _notify(self, layer: str, rng: ProfilingRange, outcome: str, message: str) -> None:
        """Tell the sampler what became of a window (the live dashboard shows it beside the request)."""
        try:
            self._send({"notice": {"layer": layer, "range": rng.to_spec(), "outcome": outcome, "message": message}})
        except Exception:  # a notice is a courtesy: never into the training loop
            pass

    def _stop(self, window: _Window, status: str) -> None:
        del self._active[window.layer]
        end = now_us()
        files: dict[str, str] = {}
        try:
            folder = ""
            if window.layer != DATALOADER:
                folder = os.path.join(self._staging or "", f"{self.pid}-{window.name}")
                os.makedirs(folder, exist_ok=True)
            files = window.profiler.stop(folder)
        except Exception as exc:
            logger.warning("%s profiling could not be saved (%s: %s)", window.layer, type(exc).__name__, exc)
            status = "failed"
        meta = {"layer": window.layer, "start_us": window.start_us, "end_us": end, "mode": TRAIN,
                "first_step": window.steps[0] if window.steps else None,
                "last_step": window.steps[-1] if window.steps else None,
                "pid": self.pid, "status": status, "range": window.range.to_spec(), **window.profiler.meta}
        self.windows.append({"window": window.name, **meta})
        self._emit((PROFILING, window.layer, window.start_us, end, GLOBAL, None, self.pid,
                    json.dumps({"window": window.name, "first_step": meta["first_step"],
                                "last_step": meta["last_step"], "status": status})))
        if files:
            self._send({"artifact": {"layer": window.layer, "window": window.name, "files": files, "meta": meta}})
        self._notify(window.layer, window.range, "failed" if status == "failed" else "captured",
                     f"{window.layer} profiling {status}: steps {meta['first_step']}–{meta['last_step']}"
                     if window.steps else f"{window.layer} profiling {status}")


def _time_end(rng: ProfilingRange) -> int:
    return (rng.start_time_us or 0) + int((rng.duration_s or 0) * 1e6)
