"""The always-on layer's hooks into PyTorch: batch requests, the top-level module's forward, backward, the
optimizer step and collectives, each timed and handed to the StepTracker. Every hook calls the user's code
exactly once and swallows its own failures (said once): the training job never sees stallwatch.

Finding "the model" without the user naming it: for a new loop's first steps, global module hooks note the
outermost module called; then per-instance hooks go on those modules and the global hooks come off, so
submodule calls cost nothing afterwards."""

from __future__ import annotations

import functools
import json
import sys
import warnings
from typing import Any, Callable

import torch

from stallwatch.log import warn_once
from stallwatch.records import COLLECTIVE, TRAIN
from stallwatch.torch import dataloader as dl
from stallwatch.torch.ddp_sync import GradientSyncTimer
from stallwatch.torch.probe import Probe
from stallwatch.torch.steps import StepTracker, now_us

DDP_STATS_EVERY_STEPS = 10  # DDP samples its own timings (first iterations, then every 100): read them this often
DISCOVERY_STEPS = 3  # steps of a new loop during which the outermost modules are looked for
DISCOVERY_CALLS_WITHOUT_STEPS = 200  # outermost calls looked at when no step is ever seen
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
               "reduce", "gather", "scatter", "barrier")


_compiling = torch.compiler.is_compiling


def _failed(what: str, exc: Exception) -> None:
    warn_once(f"hook-{what}-{type(exc).__name__}", "stallwatch's %s hook failed (%s: %s); training goes on",
              what, type(exc).__name__, exc)


def _guard(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # never into the training loop
        _failed(what, exc)
        return None


def _compiled_any() -> bool:
    """Whether torch.compile has compiled a graph in this process (it is imported only when first used)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return False
    try:
        return bool(utils.counters["stats"].get("unique_graphs"))
    except Exception:
        return True


def _set_origin(loader: Any) -> None:
    """Where the job built `loader`, kept on it (read when its iterators start)."""
    loader.__dict__["_stallwatch_origin"] = dl.creation_site(loader)


_names: dict[type, str] = {}


def _class_name(obj: Any) -> str:
    cls = type(obj)
    name = _names.get(cls)
    if name is None:
        name = _names[cls] = cls.__name__
    return name


class TorchHooks:
    """Installed once per process; `uninstall()` restores everything (tests, and a user who wants out)."""

    def __init__(self, tracker: StepTracker, emit: Callable[[tuple], None], pid: int) -> None:
        self.tracker = tracker
        self._emit = emit
        self.pid = pid
        self._undo: list[Callable[[], None]] = []
        self._depth = 0  # nesting of hooked module calls: only the outermost is a forward phase
        self._fwd_start = 0
        self._models: dict[int, Any] = {}  # id -> handles of modules found to be top-level
        self._global_handles: list[Any] = []
        self._discover_left = 0
        self._discover_calls = DISCOVERY_CALLS_WITHOUT_STEPS
        self._new_loaders: set[int] = set()
        self._loader_keys = 0
        self._optim_calls: list[tuple[Any, int]] = []  # (call's key, start) of the optimizer steps in progress
        self._ddp: list[Any] = []  # DistributedDataParallel models found: their own timing samples are read
        self._ddp_seen: dict[int, int] = {}  # id(model) -> the sampled iteration already recorded
        self._sync = GradientSyncTimer(emit, pid, now_us)  # DDP's exposed all-reduce, per step (CPU models)
        self._steps = 0
        self.enabled = True
        self.on_discovery: Callable[[], None] | None = None  # the session listens to steps again
        self.stop_reason: str | None = None  # set: every DataLoader reports its end from the next batch on
        self.probe = Probe()  # the hooks' own time, measured in short windows
        # Sampled steps (torch/sampling.py): the hooks run at every step come off the classes between stretches
        # (`disarm`): (owner, attribute, original, wrapper), and the optimizer's global hooks, registered again.
        self._hot: list[tuple[Any, str, Any, Any]] = []
        self._pair_hot: set[tuple[Any, str]] = set()  # the model's forward and backward: they count paused pairs
        self._optim_hot: set[tuple[Any, str]] = set()  # a GradScaler's step: it counts paused optimizer steps
        self._in_scaler = 0  # paused, inside a GradScaler's step: its optimizer's step is counted by the scaler's
        self._optim_handles: list[Any] = []
        self._optim_hooks: tuple[Any, Any] | None = None
        # Paused in an optimizer-delimited loop, the steps are counted by torch's own per-step call (see
        # `_count_in_step_code`), not by two hooks: (torch.optim.Optimizer, its own _optimizer_step_code).
        self._step_code: tuple[Any, Any] | None = None
        self._skip_post = False  # the hooks came back inside a step: its post hook has no step to time
        self.armed = True
        self._iters_paused: list[tuple[dict[str, Any], int, str]] = []  # (iterator's __dict__, batches before, mode)

    # -- install / uninstall --------------------------------------------------------------------------
    def install(self) -> None:
        # Discovery's global hooks make torch.compile warn on a compiled module's first call; the hooks are
        # ours and come off at once for compiled modules (see _adopt), so the warning would only mislead.
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks",
                                category=UserWarning)
        self._patch_dataloader()
        self._patch_backward()
        self._hook_optimizer()
        self._patch_collectives()
        self._undo.append(self._sync.close)
        self._start_discovery()

    def uninstall(self) -> None:
        self._stop_discovery()
        for handles in self._models.values():
            for h in handles:
                h.remove()
        self._models.clear()
        while self._undo:
            _guard("uninstall", self._undo.pop())

    def _patch(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]],
               hot: bool = False) -> None:
        """`hot`: called at every step, so taken off between sampled stretches."""
        original = getattr(owner, name)
        wrapper = functools.wraps(original)(make(original))
        wrapper.__stallwatch_original__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))
        if hot:
            self._hot.append((owner, name, original, wrapper))

    # -- sampled steps: the per-step hooks off and on ---------------------------------------------------
    @property
    def can_disarm(self) -> bool:
        """Not while the model is being looked for, nor once torch.compile has compiled anything: compiled code
        guards on the functions it traced (a model's wrapped forward), and swapping them would recompile it."""
        return self.enabled and not self._global_handles and not any(self._models.values()) and not _compiled_any() \
            and all(getattr(owner, name, None) is wrapper for owner, name, _, wrapper in self._hot)

    # Someone else's patch over one of ours (a library wrapping DataLoader.__next__ after us) is never undone: that
    # attribute is left as it is, and `can_disarm` is False from then on.

    def disarm(self, keep_optimizer: bool = False, keep_pairs: bool = False) -> None:
        """The training thread, at a step boundary: the job runs without per-step hooks from now on. The optimizer's
        hooks stay when they delimit the steps (`keep_optimizer`: they count them, and torch is iterating them);
        the model's forward and backward stay when forward/backward pairs delimit them (`keep_pairs`: they count);
        a GradScaler's step stays with the optimizer's hooks (it counts the updates it skips, too)."""
        if not self.armed:
            return
        self.armed = False
        for owner, name, original, wrapper in self._hot:
            key = (owner, name)
            if (keep_pairs and key in self._pair_hot) or (keep_optimizer and key in self._optim_hot):
                continue
            if getattr(owner, name, None) is wrapper:
                setattr(owner, name, original)
        if keep_optimizer:
            return
        for h in self._optim_handles:
            h.remove()
        self._optim_handles = []

    def arm(self) -> None:
        """Any thread: the per-step wrappers back on (an attribute write each: a call in progress is unaffected).
        The optimizer's hooks come back with `arm_optimizer`, on the training thread: torch iterates them there."""
        if self.armed or not self.enabled:
            return
        for owner, name, original, wrapper in self._hot:
            if getattr(owner, name, None) is original:
                setattr(owner, name, wrapper)
        self.armed = True

    def arm_optimizer(self) -> None:
        """The training thread, at a step boundary: the optimizer's global hooks registered again (and torch's own
        step code back, when the paused steps were counted there)."""
        self._leave_step_code()
        if self.enabled and not self._optim_handles:
            self._register_optimizer_hooks()

    def count_paused(self) -> dict[str, int]:
        """Per mode, the batches the data loaders handed out since steps were paused: each one is a step (the
        iterators count them themselves, in `_num_yielded`)."""
        counts: dict[str, int] = {}
        for state, before, mode in self._iters_paused:
            n = state.get("_num_yielded", before)
            if isinstance(n, int) and n > before:
                counts[mode] = counts.get(mode, 0) + n - before
        self._iters_paused = []
        return counts

    # -- data loader ----------------------------------------------------------------------------------
    def _patch_dataloader(self) -> None:
        from torch.utils.data import dataloader as tdl

        hooks = self

        def build_next(original, probed):
            def __next__(it):  # the hottest wrapper: plain try/except, no helper frames
                if probed is not None and probe.on:
                    return probed(it)
                if not hooks.enabled:
                    return original(it)
                key = getattr(it, "_stallwatch_loader", 0)
                if hooks.stop_reason is not None:
                    raise StopIteration  # training was asked to stop: the loop ends as at the end of its data
                try:
                    t0 = hooks._batch_begin(key, it)
                except Exception as exc:
                    t0 = _failed("dataloader", exc)
                if hooks.stop_reason is not None:  # asked at this very boundary (the new config applies here)
                    if t0 is not None:
                        _guard("dataloader", hooks.tracker.batch_end, key, t0, True)
                    raise StopIteration
                try:
                    batch = original(it)
                except StopIteration:
                    if t0 is not None:
                        _guard("dataloader", hooks.tracker.batch_end, key, t0, True)
                    raise
                if t0 is not None:
                    try:
                        hooks.tracker.batch_end(key, t0, False)
                    except Exception as exc:
                        _failed("dataloader", exc)
                return batch
            return __next__

        probe = self.probe

        def make_next(original):
            return probe.wrap(build_next, original)

        def make_init(original):
            def __init__(it, loader, *args, **kwargs):
                original(it, loader, *args, **kwargs)
                if hooks.enabled:
                    _guard("dataloader", hooks._loader_started, it, loader)
            return __init__

        def make_loader_init(original):
            def __init__(loader, *args, **kwargs):
                original(loader, *args, **kwargs)
                if hooks.enabled and "_stallwatch_origin" not in loader.__dict__:
                    _guard("dataloader", _set_origin, loader)
            return __init__

        self._patch(tdl._BaseDataLoaderIter, "__next__", make_next, hot=True)
        for cls in (tdl._SingleProcessDataLoaderIter, tdl._MultiProcessingDataLoaderIter):
            self._patch(cls, "__init__", make_init)
        self._patch(tdl.DataLoader, "__init__", make_loader_init)
        self._undo.extend(dl.patch_fetchers(self._emit))

    def _batch_begin(self, key: int, it: Any) -> int:
        self._depth = 0  # a forward that raised (its post hook never ran) must not hide the next ones
        tracker = self.tracker
        if tracker.paused_at is not None:  # the hooks are back after a stretch of counted steps
            tracker.resume(now_us())
        if key in self._new_loaders:  # a loop that has not run before: look for its model again
            self._new_loaders.discard(key)
            self._start_discovery()
        grad = torch.is_grad_enabled()
        t0 = tracker.batch_begin(key, grad)
        if tracker.paused_at is not None:  # paused at this boundary: count this iterator's batches from here
            self._iters_paused.append((it.__dict__, it.__dict__.get("_num_yielded", 0), tracker.loader_mode(key, grad)))
        return t0

    def _loader_started(self, it: Any, loader: Any) -> None:
        # A loader's key is its own for the process's life: `id()` is reused once a loader is freed, and a new
        # evaluation loader would inherit a freed training loader's mode (and not count as a new loop).
        key = getattr(loader, "_stallwatch_key", None)
        if not isinstance(key, int):
            self._loader_keys += 1
            key = self._loader_keys
            try:
                loader._stallwatch_key = key
            except Exception:
                key = id(loader)
            self._new_loaders.add(key)
        it._stallwatch_loader = key
        if self.tracker.paused_at is not None:  # a new epoch (or another loop) while steps are counted
            self._iters_paused.append((it.__dict__, 0, self.tracker.loader_mode(key, torch.is_grad_enabled())))
        t = now_us()
        self._emit(("dataloader", type(loader.dataset).__name__, t, t, "GLOBAL", None, self.pid,
                    json.dumps(dl.describe(it, loader, key), default=str)))

    # -- forward: discovery, then per-instance hooks --------------------------------------------------
    @property
    def needs_steps(self) -> bool:
        """Step ends are needed while discovering the model, and to read DDP's timings."""
        return bool(self._global_handles or self._ddp)

    def _start_discovery(self) -> None:
        self._discover_left = DISCOVERY_STEPS
        if self._global_handles:
            return
        from torch.nn.modules import module as nn_module

        self._global_handles = [
            nn_module.register_module_forward_pre_hook(self._discover_pre),
            nn_module.register_module_forward_hook(self._discover_post, always_call=True),
        ]
        if self.on_discovery is not None:
            self.on_discovery()

    def _stop_discovery(self) -> None:
        for h in self._global_handles:
            h.remove()
        self._global_handles = []

    def _discover_pre(self, module: Any, _args: Any) -> None:
        if _compiling():  # traced by torch.compile: contribute nothing to the graph
            return
        if self._depth == 0 and self.enabled:
            _guard("forward", self._adopt, module)
            if id(module) not in self._models:
                # Not a model (a loss or an activation called on its own): no forward phase of its own, as once
                # discovery ends. A loss under no_grad was an EVAL step of its own (time_sequence_prediction's
                # evaluation: "EVAL 3 for 2").
                return
        self._pre(module, _args)

    def _discover_post(self, module: Any, _args: Any, _out: Any) -> None:
        if _compiling():
            return
        self._post(module, _args, _out)
        if self._depth == 0 and self.enabled:
            _guard("forward", self._discovery_tick)

    def _adopt(self, module: Any) -> None:
        """The outermost module of a call, if it holds parameters (a model, not a loss function or an
        activation called on its own): from now on hooked on its own."""
        if id(module) in self._models or next(module.parameters(), None) is None:
            return
        compiled = type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None
        if compiled or "forward" in vars(module):
            # A compiled module's (or an instance's own) forward is not its class's: module hooks instead.
            def measured(fn):
                return self.probe.measured(fn, bypass=_compiling)

            self._models[id(module)] = [module.register_forward_pre_hook(measured(self._instance_pre)),
                                        module.register_forward_hook(measured(self._instance_post),
                                                                     always_call=True)]
        else:
            self._models[id(module)] = []
            self._wrap_forward(type(module))
        self._discover_left = DISCOVERY_STEPS
        if compiled:
            # torch.compile guards on global hooks: removing them later would recompile the model. Stop
            # looking now, before the compiled frame runs.
            self._stop_discovery()
        if type(module).__name__ == "DistributedDataParallel" and hasattr(module, "_get_ddp_logging_data"):
            self._ddp.append(module)
            _guard("ddp", self._sync.found, module)

    def _wrap_forward(self, cls: type) -> None:
        """Time the model's forward with a wrapper on its class: module hooks would send every call down
        nn.Module's slow path (~2 µs more per call). Instances are not touched (pickling is unchanged);
        `__wrapped__` keeps the signature visible to frameworks that inspect it."""
        if "__stallwatch_original__" in getattr(cls.forward, "__dict__", {}):
            return
        own = "forward" in vars(cls)
        original = cls.forward
        name = cls.__name__
        hooks = self

        probe = self.probe

        def build(inner, probed):
            def forward(module, *args, **kwargs):
                if hooks._depth or not hooks.enabled or _compiling():
                    return inner(module, *args, **kwargs)
                if probed is not None and probe.on:  # after the compile check: torch.compile must not guard on it
                    return probed(module, *args, **kwargs)
                tracker = hooks.tracker
                if tracker.paused_at is not None and not (tracker.rearmed or tracker.resume_any):
                    hooks._depth = 1  # steps counted in a loop of pairs (torch/sampling.py): count, do not time
                    try:
                        return inner(module, *args, **kwargs)
                    finally:
                        hooks._depth = 0
                        try:
                            tracker.pair_forward(torch.is_grad_enabled())
                        except Exception as exc:
                            _failed("forward", exc)
                hooks._depth = 1
                t0 = now_us()
                try:
                    return inner(module, *args, **kwargs)
                finally:
                    hooks._depth = 0
                    try:
                        hooks.tracker.forward(t0, now_us(), name, torch.is_grad_enabled())
                    except Exception as exc:
                        _failed("forward", exc)
            return forward

        forward = functools.wraps(original)(probe.wrap(build, original))
        forward.__stallwatch_original__ = original  # type: ignore[attr-defined]
        cls.forward = forward
        self._undo.append(lambda: setattr(cls, "forward", original) if own else delattr(cls, "forward"))
        self._hot.append((cls, "forward", original, forward))
        self._pair_hot.add((cls, "forward"))

    def _discovery_tick(self) -> None:
        self._discover_calls -= 1
        if self.tracker.in_step:
            return  # counted when steps end (on_step_end)
        if self._discover_calls <= 0 and self.tracker.source is None:
            self._stop_discovery()

    def step_ended(self) -> None:
        """Called by the session after each step: discovery runs for a few steps of each new loop."""
        if self._global_handles:
            self._discover_left -= 1
            if self._discover_left <= 0:
                self._stop_discovery()
        self._steps += 1
        if self._ddp and self._steps % DDP_STATS_EVERY_STEPS == 0:
            self.record_ddp_stats()

    def record_ddp_stats(self) -> None:
        """DDP times its gradient all-reduce inside backward itself (on sampled iterations): record each
        new sample as a collective, with DDP's averages."""
        for model in self._ddp:
            data = _guard("ddp", model._get_ddp_logging_data)
            if not data or data.get("iteration") == self._ddp_seen.get(id(model)):
                continue
            start, end = data.get("backward_comm_time_start"), data.get("backward_comm_time_end")
            if not start or not end:
                continue
            self._ddp_seen[id(model)] = data.get("iteration")
            info = {"iteration": data.get("iteration"), "bucket_sizes": data.get("bucket_sizes"),
                    **{f"{k}_us": data[k] / 1000 for k in
                       ("avg_backward_comm_time", "avg_backward_compute_time",
                        "avg_backward_compute_comm_overlap_time", "avg_forward_compute_time") if k in data}}
            self._emit((COLLECTIVE, "ddp_gradient_all_reduce", start // 1000, end // 1000, "TRAIN", None,
                        self.pid, json.dumps(info)))

    def _instance_pre(self, module: Any, args: Any) -> None:
        if not self._global_handles and not _compiling():
            self._pre(module, args)

    def _instance_post(self, module: Any, args: Any, out: Any) -> None:
        if not self._global_handles and not _compiling():
            self._post(module, args, out)

    def _pre(self, module: Any, _args: Any) -> None:
        if not self.enabled:
            return
        self._depth += 1
        if self._depth == 1:
            self._fwd_start = now_us()

    def _post(self, module: Any, _args: Any, _out: Any) -> None:
        if self._depth <= 0 or not self.enabled:
            return
        self._depth -= 1
        if self._depth == 0:
            try:
                self.tracker.forward(self._fwd_start, now_us(), _class_name(module), torch.is_grad_enabled())
            except Exception as exc:
                _failed("forward", exc)

    # -- backward, optimizer, collectives -------------------------------------------------------------
    def _timed(self, what: str, record: Callable[[int, tuple, dict], None],
               counted: Callable[[], None] | None = None,
               before: Callable[[tuple, dict], None] | None = None) -> Callable[..., Any]:
        """A wrapper factory for `_patch`: the original runs exactly once; `before(args, kwargs)` ahead of it and
        `record(t0, args, kwargs)` after it, their failures said once and swallowed. While steps are counted, not
        timed, `counted()` instead."""
        hooks, tracker = self, self.tracker

        def build(original, probed):
            def timed(*args, **kwargs):
                if not hooks.enabled or _compiling():
                    return original(*args, **kwargs)
                if probed is not None and hooks.probe.on:  # after the compile check: torch.compile must not guard on it
                    return probed(*args, **kwargs)
                if counted is not None and tracker.paused_at is not None \
                        and not (tracker.rearmed or tracker.resume_any):
                    try:
                        return original(*args, **kwargs)
                    finally:
                        try:
                            counted()
                        except Exception as exc:
                            _failed(what, exc)
                t0 = now_us()
                if before is not None:
                    try:
                        before(args, kwargs)
                    except Exception as exc:
                        _failed(what, exc)
                try:
                    return original(*args, **kwargs)
                finally:
                    try:
                        record(t0, args, kwargs)
                    except Exception as exc:
                        _failed(what, exc)
            return timed
        return lambda original: self.probe.wrap(build, original)

    def _patch_backward(self) -> None:
        tracker, sync = self.tracker, self._sync

        def record(t0: int, _a: tuple, _k: dict) -> None:
            t1 = now_us()
            tracker.backward(t0, t1)
            sync.end(t1, tracker.other)  # DDP's exposed all-reduce inside it, where it was timed

        self._patch(torch.autograd, "backward",
                    self._timed("backward", record, counted=tracker.pair_backward, before=sync.begin), hot=True)
        self._pair_hot.add((torch.autograd, "backward"))

    def _hook_optimizer(self) -> None:
        def measured(fn):
            return self.probe.measured(fn, bypass=_compiling)

        timed_pre = measured(lambda opt, args, kwargs: self._optim_pre(id(opt), id(opt), args, kwargs))
        timed_post = measured(lambda opt, _a, _k: self._optim_post(id(opt), opt))
        tracker, calls, hooks = self.tracker, self._optim_calls, self

        # Steps counted, not timed (torch/sampling.py), in a loop the optimizer delimits: these hooks stay (torch
        # iterates them while the pause begins, so they are never removed then) and only count the steps.
        def pre(opt: Any, args: Any, kwargs: Any) -> Any:
            if tracker.paused_at is not None:
                return None
            return timed_pre(opt, args, kwargs)

        def post(opt: Any, args: Any, kwargs: Any) -> Any:
            if hooks._skip_post:
                hooks._skip_post = False
                return None
            if tracker.paused_at is not None:
                if calls:
                    calls.clear()
                if hooks._in_scaler:  # the scaler's step around it counts it (and the updates it skips)
                    return None
                try:
                    tracker.optimizer_counted(id(opt))
                    if tracker.paused_at is not None and id(opt) == tracker.counted_optimizer:
                        hooks._count_in_step_code(opt)
                except Exception as exc:
                    _failed("optimizer", exc)
                return None
            return timed_post(opt, args, kwargs)

        self._optim_hooks = (pre, post)
        self._register_optimizer_hooks()
        self._undo.append(self._remove_optimizer_hooks)
        self._patch_grad_scaler()

    def _count_in_step_code(self, opt: Any) -> None:
        """Paused (in the post hook of the loop's first optimizer): from the next step on, count in torch's own
        `Optimizer._optimizer_step_code`, a no-op it calls in every step between the update and the post hooks,
        and take the two global hooks off there (torch has not begun iterating the post hooks then). Two hook
        calls a step were 3–5 % of a 30 µs step; the counting in the no-op's place costs a dict update. Not for an
        optimizer whose class has its own `_optimizer_step_code` (it would not be called): the hooks stay."""
        from torch.optim import Optimizer

        if self._step_code is not None or not self.enabled:
            return
        original = Optimizer.__dict__.get("_optimizer_step_code")
        if original is None or getattr(type(opt), "_optimizer_step_code", None) is not original:
            return
        hooks, tracker = self, self.tracker

        def _optimizer_step_code(optimizer: Any) -> None:
            try:
                if hooks._optim_handles:
                    hooks._remove_optimizer_hooks()
                if id(optimizer) != tracker.counted_optimizer or hooks._in_scaler:
                    return
                if tracker.paused_at is None or tracker.rearmed or tracker.resume_any:
                    hooks._leave_step_code()  # resumes here; the hooks come back for this step's post
                    if tracker.paused_at is not None:
                        tracker.optimizer_counted(id(optimizer))
                    hooks.arm_optimizer()
                    hooks._skip_post = True
                    return
                marks = tracker._marks_paused
                marks[TRAIN] = marks.get(TRAIN, 0) + 1
            except Exception as exc:
                _failed("optimizer", exc)

        self._step_code = (Optimizer, original)
        Optimizer._optimizer_step_code = _optimizer_step_code
        self._undo.append(self._leave_step_code)

    def _leave_step_code(self) -> None:
        """torch's own `_optimizer_step_code` back (idempotent)."""
        if self._step_code is not None:
            owner, original = self._step_code
            self._step_code = None
            owner._optimizer_step_code = original

    def _register_optimizer_hooks(self) -> None:
        from torch.optim import optimizer as optim

        if self._optim_hooks is None:
            return
        pre, post = self._optim_hooks
        self._optim_handles = [optim.register_optimizer_step_pre_hook(pre),
                               optim.register_optimizer_step_post_hook(post)]

    def _remove_optimizer_hooks(self) -> None:
        for h in self._optim_handles:
            h.remove()
        self._optim_handles = []

    def _patch_grad_scaler(self) -> None:
        """`scaler.step(optimizer)` is the iteration's update even when the scaler skips `optimizer.step()` (the
        gradients overflowed: the first iterations of fp16 training, and now and then later): it counts as that
        optimizer's step, and the step inside it (when there is one) counts once, as a wrapped optimizer's does.
        Between sampled stretches it stays on with the optimizer's hooks and counts that step, skipped or not."""
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:  # an older torch: skipped updates join the next step
            return
        hooks, tracker = self, self.tracker

        def build(original, probed):
            def step(scaler, optimizer, *args, **kwargs):
                if not hooks.enabled or _compiling():
                    return original(scaler, optimizer, *args, **kwargs)
                if tracker.paused_at is None:
                    if probed is not None and hooks.probe.on:
                        return probed(scaler, optimizer, *args, **kwargs)
                    key = ("scaler", id(optimizer))
                    _guard("optimizer", hooks._optim_pre, key, id(optimizer))
                    if tracker.paused_at is None:
                        try:
                            return original(scaler, optimizer, *args, **kwargs)
                        finally:
                            _guard("optimizer", hooks._optim_post, key, optimizer)
                    # The pause began at this update's start: it is the first one counted, and by the scaler (an
                    # update it skips has no optimizer step to count it).
                    hooks._optim_calls.clear()
                hooks._in_scaler += 1  # steps counted, not timed: this is the iteration's update
                try:
                    return original(scaler, optimizer, *args, **kwargs)
                finally:
                    hooks._in_scaler -= 1
                    try:
                        tracker.optimizer_counted(id(optimizer))
                    except Exception as exc:
                        _failed("optimizer", exc)
            return step

        self._patch(GradScaler, "step", lambda original: self.probe.wrap(build, original), hot=True)
        self._optim_hot.add((GradScaler, "step"))

    def _optim_pre(self, key: Any, who: int, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Only the outermost optimizer step is the loop's: one that wraps another (ZeroRedundancyOptimizer,
        Lookahead, accelerate's, a GradScaler's step) steps it inside its own. One already in progress is a step
        that raised (its post hook never ran): start afresh. `key` names the call, `who` the optimizer. The
        outermost step's closure (`args`, `kwargs`: the call's, self first) comes back timed, as torch's pre
        hooks may return the call's arguments."""
        calls = self._optim_calls
        if any(k == key for k, _ in calls):
            calls.clear()
        calls.append((key, now_us()))
        if len(calls) == 1 and self.enabled:
            try:
                self.tracker.optimizer_begin(calls[0][1], who)
            except Exception as exc:
                _failed("optimizer", exc)
            if len(args) > 1 or kwargs:
                return _guard("optimizer", self._timed_closure, args, kwargs)
        return None

    def _timed_closure(self, args: tuple, kwargs: dict | None) -> tuple[tuple, dict] | None:
        """The call's arguments with its closure wrapped to report when it ran (None: no closure, nothing to
        change). The closure is called exactly as often, with the same arguments, as without stallwatch."""
        kwargs = kwargs or {}
        closure = kwargs.get("closure") if "closure" in kwargs else args[1] if len(args) > 1 else None
        if not callable(closure) or getattr(closure, "__stallwatch_closure__", False):
            return None
        tracker = self.tracker

        def timed_closure(*a: Any, **k: Any) -> Any:
            t0 = now_us()
            try:
                return closure(*a, **k)
            finally:
                try:
                    tracker.closure(t0, now_us())
                except Exception as exc:
                    _failed("optimizer", exc)

        timed_closure.__stallwatch_closure__ = True  # type: ignore[attr-defined]
        if "closure" in kwargs:
            return args, {**kwargs, "closure": timed_closure}
        return (args[0], timed_closure, *args[2:]), kwargs

    def _optim_post(self, key: Any, opt: Any) -> None:
        calls = self._optim_calls
        if not calls or calls[-1][0] != key:
            calls.clear()  # not the one begun last: the record is lost, the next step starts clean
            return
        _, t0 = calls.pop()
        if not calls and self.enabled:
            try:
                self.tracker.optimizer(t0, now_us(), _class_name(opt), id(opt))
            except Exception as exc:
                _failed("optimizer", exc)

    def _patch_collectives(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        for name in COLLECTIVES:
            if not hasattr(dist, name):
                continue
            record = functools.partial(self._collective, name)
            self._patch(dist, name, self._timed("collective", record))

    def _collective(self, name: str, t0: int, args: tuple, kwargs: dict) -> None:
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("tensor")
        info: dict[str, Any] = {"async": bool(kwargs.get("async_op", False))}
        if isinstance(tensor, torch.Tensor):
            info["bytes"] = tensor.numel() * tensor.element_size()
        self.tracker.other(COLLECTIVE, name, t0, now_us(), json.dumps(info))
