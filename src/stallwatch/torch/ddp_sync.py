"""DistributedDataParallel's gradient all-reduce, timed on every timed step where the host can see it (CPU models,
gloo): DDP launches a bucket's all-reduce as soon as its gradients are ready, and at the end of backward its
finalizer waits for every bucket and copies the results into `.grad`. What the step waits for — the exposed
part — runs from the end of backward's computation to the return of `backward()`.

How, cheaply (two Python calls from autograd a step, none per bucket; docs/benchmarks.md): a pre-hook on the loss's grad_fn queues an autograd final
callback when the graph starts running; final callbacks run in the order queued, so ours runs when the graph's
computation is done, before DDP's finalizer (queued later, when the last bucket is ready). `backward()` returns
after the finalizer. A communication hook would time each bucket too, but DDP allows one hook (a user's would
then fail to register, or ours could not wrap one registered before the model was found), and a Python hook per
bucket replaces DDP's C++ all-reduce with Python calls that cost more than the hooks' whole step budget.

On CUDA the host does not wait for NCCL (the finalizer makes the stream wait), so nothing is measured there:
DDP's own sampled timing (CUDA events) is what the rules read."""

from __future__ import annotations

import json
from typing import Any, Callable

import torch

from stallwatch.log import warn_once
from stallwatch.records import COLLECTIVE

_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
SYNC_EVENT = "ddp_gradient_sync"  # one per timed step that reduced gradients: the exposed part
CONFIG_KIND = "ddp"  # one per model found: its communication settings


def _failed(exc: Exception) -> None:
    warn_once(f"hook-ddp-sync-{type(exc).__name__}", "stallwatch's DDP timing failed (%s: %s); training goes on",
              type(exc).__name__, exc)


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
        self._models: list[tuple[Any, str]] = []  # (model, the per-step event's args)
        self._done_at: int | None = None  # when the graph's computation ended (our final callback)
        self._args: str | None = None

    def found(self, model: Any) -> None:
        """A DDP model: its settings recorded once; timed per step when it lives on the CPU."""
        facts = describe(model)
        t = self._now()
        self._emit((CONFIG_KIND, type(model).__name__, t, t, "GLOBAL", None, self._pid, json.dumps(facts)))
        if facts["device_type"] == "cpu":
            self._models.append((model, json.dumps({"bytes": facts["bytes"]})))

    def begin(self, args: tuple, kwargs: dict) -> None:
        """`torch.autograd.backward` is called: when a DDP model will reduce, note when its graph is computed."""
        self._done_at = self._args = None
        models = self._models
        if not models:
            return
        if len(models) == 1:
            model, syncing = models[0]
            if not model.require_backward_grad_sync:
                return  # under no_sync(): nothing is reduced
        else:
            chosen = [a for m, a in models if m.require_backward_grad_sync]
            if not chosen:
                return
            syncing = chosen[0] if len(chosen) == 1 else json.dumps(
                {"bytes": sum(json.loads(a)["bytes"] for a in chosen)})
        tensors = args[0] if args else kwargs.get("tensors")
        fn = tensors.grad_fn if isinstance(tensors, torch.Tensor) else getattr(
            next(iter(tensors), None) if tensors else None, "grad_fn", None)
        if fn is None:
            return
        fn.register_prehook(self._graph_starts)
        self._args = syncing

    def _graph_starts(self, _grads: Any) -> None:
        try:
            _queue_callback(self._graph_done)
        except Exception as exc:  # never into backward
            _failed(exc)

    def _graph_done(self) -> None:
        self._done_at = self._now()

    def end(self, t1: int, record: Callable[[str, str, int, int, str], None]) -> None:
        """`backward()` returned at `t1`: the exposed all-reduce recorded as a collective of the step."""
        at, args = self._done_at, self._args
        self._done_at = self._args = None
        if at is not None and args is not None and at <= t1:
            record(COLLECTIVE, SYNC_EVENT, at, t1, args)
