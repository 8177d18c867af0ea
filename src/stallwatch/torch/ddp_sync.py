"""DistributedDataParallel's gradient all-reduce, timed on every timed step where the host can see it (CPU models,
gloo): DDP launches a bucket's all-reduce as soon as its gradients are ready, and at the end of backward its
finalizer waits for every bucket and copies the results into `.grad`. What the step waits for — the exposed
part — runs from the end of backward's computation to the return of `backward()`.

How, cheaply (one Python call from autograd a step, none per bucket; docs/benchmarks.md): a hook on the parameter
whose gradient is ready last — DDP's own per-parameter timing (`reducer.get_backward_stats()`) names it after the
first backward — notes the time when it is accumulated: the end of the graph's computation, just before DDP's own
hook on it launches the last bucket's all-reduce (a tensor's post-accumulate-grad hook runs inside its accumulation,
the reducer's after it). `backward()` returns after DDP's finalizer has waited for every bucket. (An autograd final
callback queued from a pre-hook on each step's loss would find the graph's end without DDP's help, but registering a
hook and queueing a callback cost ≈ 15 µs a step.)

A communication hook would time each bucket too, but DDP allows one hook (a user's would then fail to register, or
ours could not wrap one registered before the model was found), and a Python hook per bucket replaces DDP's C++
all-reduce with Python calls that cost more than the hooks' whole step budget. Not timed: a model whose reducer's
parameters are not its own `parameters()` that require grad (shared or ignored parameters): the hook is not placed.

On CUDA the host does not wait for NCCL (the finalizer makes the stream wait), so nothing is measured there:
DDP's own sampled timing (CUDA events) is what the rules read."""

from __future__ import annotations

import json
from typing import Any, Callable

from stallwatch.records import COLLECTIVE
from stallwatch.records import DDP_CONFIG as CONFIG_KIND  # one per model found: its communication settings
from stallwatch.records import DDP_SYNC as SYNC_EVENT  # one per timed step that reduced gradients: the exposed part


def describe(model: Any) -> dict[str, Any]:
    """The DDP model's settings that decide its communication (what the advice is phrased in)."""
    params = [p for p in model.parameters() if p.requires_grad]
    world = None
    try:
        world = int(model.process_group.size())
    except Exception:
        pass
    try:
        backend = str(model.process_group.name())
    except Exception:
        backend = None
    cap = getattr(model, "bucket_bytes_cap", None)
    return {"bytes": int(sum(p.numel() * p.element_size() for p in params)), "params": len(params),
            "device_type": getattr(model, "device_type", None), "world_size": world, "backend": backend,
            "bucket_cap_mb": cap / (1024 * 1024) if isinstance(cap, (int, float)) else None,
            "gradient_as_bucket_view": getattr(model, "gradient_as_bucket_view", None),
            "find_unused_parameters": getattr(model, "find_unused_parameters", None),
            "static_graph": getattr(model, "static_graph", None)}


class GradientSyncTimer:
    """Per process: the CPU DDP models found, and the exposed all-reduce of the backward pass in progress."""

    def __init__(self, emit: Callable[[tuple], None], pid: int, now_us: Callable[[], int]) -> None:
        self._emit, self._pid, self._now = emit, pid, now_us
        self._models: list[list[Any]] = []  # [model, the per-step event's args, its parameters until the hook is on]
        self._handles: list[Any] = []
        self._done_at: int | None = None  # when the graph's computation ended (the last gradient's accumulation)
        self._args: str | None = None  # set while a timed backward that reduces runs

    def found(self, model: Any) -> None:
        """A DDP model: its settings recorded once; timed per step when it lives on the CPU."""
        facts = describe(model)
        t = self._now()
        self._emit((CONFIG_KIND, type(model).__name__, t, t, "GLOBAL", None, self._pid, json.dumps(facts)))
        if facts["device_type"] != "cpu" or not hasattr(getattr(model, "reducer", None), "get_backward_stats"):
            return
        params = [p for p in model.parameters() if p.requires_grad]
        if params:
            self._models.append([model, json.dumps({"bytes": facts["bytes"]}), params])

    def close(self) -> None:
        """The parameters' hooks off (uninstall)."""
        for h in self._handles:
            h.remove()
        self._handles, self._models = [], []

    def _place(self, entry: list[Any]) -> None:
        """The hook on the parameter DDP saw ready last (once it has timed a backward): from then on, every step."""
        model, _, params = entry
        stats = model.reducer.get_backward_stats()
        if len(stats) != len(params) or not any(stats):
            return  # no backward yet
        last = max(range(len(stats)), key=stats.__getitem__)
        self._handles.append(params[last].register_post_accumulate_grad_hook(self._last_ready))
        entry[2] = None

    def begin(self, _args: tuple, _kwargs: dict) -> None:
        """`torch.autograd.backward` is called (timed): when a DDP model will reduce, time its exposed all-reduce."""
        self._done_at = self._args = None
        for entry in self._models:
            if entry[0].require_backward_grad_sync:  # else under no_sync(): nothing is reduced
                if entry[2] is not None:
                    self._place(entry)
                    if entry[2] is not None:
                        continue
                self._args = entry[1] if self._args is None else json.dumps(
                    {"bytes": json.loads(self._args)["bytes"] + json.loads(entry[1])["bytes"]})

    def _last_ready(self, _param: Any) -> None:
        if self._args is not None:  # a timed step that reduces
            self._done_at = self._now()

    def end(self, t1: int, record: Callable[[str, str, int, int, str], None]) -> None:
        """`backward()` returned at `t1`: the exposed all-reduce recorded as a collective of the step."""
        at, args = self._done_at, self._args
        self._done_at = self._args = None
        if at is not None and args is not None and at <= t1:
            record(COLLECTIVE, SYNC_EVENT, at, t1, args)
