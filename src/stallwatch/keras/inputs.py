"""What Keras feeds a loop from, as the facts the Dataloader and InputBound rules read (the `dataloader`
event a PyTorch DataLoader gets), and the time each batch took to fetch.

Keras draws batches through an epoch iterator. Its iterator is wrapped so each `next()` is timed: on the torch
backend Keras fetches between the batch callbacks, on JAX inside the step call (before the compiled step
runs); either way the fetch is the step's data wait. On TensorFlow the iterator is consumed inside the
compiled `tf.function`, so it is left alone: no data wait is measured there."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stallwatch.log import warn_once

_time_ns = time.time_ns

# Called with (t0_us, exhausted) after each batch fetch of a Keras loop; None: nobody listens.
on_fetch: Callable[[int, bool], None] | None = None
latest: dict[str, Any] = {}  # the facts of the input of the epoch iterator made last


def describe(adapter: Any) -> dict[str, Any]:
    """The input's facts: its kind (arrays, py_dataset, generator, tf_data, torch_dataloader, grain), worker
    processes (`num_workers`, as for a DataLoader) or threads, prefetching, whether it lives in memory."""
    kind = type(adapter).__name__
    facts: dict[str, Any] = {"framework": "keras", "loader_id": id(adapter), "adapter": kind,
                             "batch_size": _safe(lambda: adapter.batch_size), "num_workers": 0,
                             "worker_threads": 0, "prefetch": False, "in_memory": False}
    if kind == "ArrayDataAdapter":
        facts.update(input="arrays", dataset="arrays", in_memory=True)
    elif kind == "PyDatasetAdapter":
        ds = adapter.py_dataset
        workers = int(getattr(ds, "workers", 1) or 0)
        processes = bool(getattr(ds, "use_multiprocessing", False))
        parallel = workers > 1 or (workers > 0 and processes)  # as Keras decides to start an enqueuer
        facts.update(input="py_dataset", dataset=type(ds).__name__, use_multiprocessing=processes,
                     max_queue_size=getattr(ds, "max_queue_size", None), prefetch=parallel,
                     num_workers=workers if parallel and processes else 0,
                     worker_threads=workers if parallel and not processes else 0)
    elif kind == "GeneratorDataAdapter":
        facts.update(input="generator", dataset=type(getattr(adapter, "generator", None)).__name__)
    elif kind == "TFDatasetAdapter":
        name = type(getattr(adapter, "_dataset", None)).__name__
        # tf.data runs its own threads; a prefetch at the end of the pipeline shows in the dataset's class
        facts.update(input="tf_data", dataset=name, num_workers=None, prefetch="Prefetch" in name)
    elif kind == "TorchDataLoaderAdapter":
        loader = getattr(adapter, "_dataloader", None)
        workers = int(getattr(loader, "num_workers", 0) or 0)
        facts.update(input="torch_dataloader", dataset=type(getattr(loader, "dataset", None)).__name__,
                     num_workers=workers, prefetch=workers > 0 and bool(getattr(loader, "prefetch_factor", 0)),
                     pin_memory=bool(getattr(loader, "pin_memory", False)),
                     prefetch_factor=getattr(loader, "prefetch_factor", None))
    elif "Grain" in kind:
        facts.update(input="grain", dataset=type(getattr(adapter, "_dataset", None)).__name__, num_workers=None)
    else:
        facts.update(input="other", dataset=kind)
    return facts


def _safe(get: Callable[[], Any]) -> Any:
    try:
        value = get()
    except Exception:
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class _TimedIterable:
    """What the epoch iterator's `_get_iterator()` returned, iterated through a timer."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __iter__(self) -> _TimedIterator:
        return _TimedIterator(iter(self._inner))


class _TimedIterator:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        listener = on_fetch
        if listener is None:
            return next(self._inner)
        t0 = _time_ns() // 1000
        try:
            batch = next(self._inner)
        except StopIteration:
            _tell(listener, t0, True)
            raise
        _tell(listener, t0, False)
        return batch


def _tell(listener: Callable[[int, bool], None], t0: int, exhausted: bool) -> None:
    try:
        listener(t0, exhausted)
    except Exception as exc:  # never into the training loop
        warn_once(f"keras-fetch-{type(exc).__name__}", "stallwatch could not time a Keras batch (%s: %s)",
                  type(exc).__name__, exc)


def patch_epoch_iterator(time_fetches: bool) -> None:
    """Note each epoch iterator's input (`latest`) and, unless `time_fetches` is False (TensorFlow), time its
    fetches. Idempotent; the wrapper runs Keras's own code exactly once and never raises."""
    from keras.src.trainers import epoch_iterator as ei

    cls = ei.EpochIterator
    if getattr(cls.__init__, "__stallwatch_original__", None) is not None:
        return
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            _noted(self, time_fetches)
        except Exception as exc:
            warn_once("keras-epoch-iterator", "stallwatch could not follow a Keras input (%s: %s)",
                      type(exc).__name__, exc)

    __init__.__stallwatch_original__ = original  # type: ignore[attr-defined]
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _noted(iterator: Any, time_fetches: bool) -> None:
    adapter = getattr(iterator, "data_adapter", None)
    if adapter is not None:
        latest.clear()
        latest.update(describe(adapter))
    if not time_fetches:
        return
    make = iterator._get_iterator  # the backend's own (bound); shadowed on this instance only

    def _get_iterator() -> Any:
        return _TimedIterable(make())

    iterator._get_iterator = _get_iterator
