"""Where the per-node and per-slice work of an analysis runs: in this process (`local`, the default) or on a
Dask cluster (`dask`: a local cluster; `dask=tcp://host:8786`: an existing scheduler). Work items are plain
functions of the run's URI and small arguments, so a worker reads the run itself (a shared path or S3) and
sends back only results; the caller gets them in order, with a bounded number in flight.

    with open_engine("dask") as engine:
        totals = list(engine.map(some_function, items))
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")

LOCAL = "local"
DASK = "dask"
CONNECT_TIMEOUT_S = 10  # an unreachable scheduler is said after this long
NO_WORKER_S = 30.0  # a cluster without a worker this long cannot finish the work: said, not waited on forever
LOST_SCHEDULER_S = 10.0  # a scheduler the client has lost this long (it died, or the network did): said
POLL_S = 1.0  # how often a task's wait looks at the cluster


class EngineError(RuntimeError):
    """An engine that cannot be used: an unknown name, dask not installed, a scheduler that cannot be reached."""


@dataclass
class EngineStats:
    """What an engine did: tasks run, bytes of results sent back to the caller (their arrays and tables:
    `payload_bytes`; nothing is sent between workers), and each worker's peak resident memory when asked."""

    tasks: int = 0
    result_bytes: int = 0
    worker_peak_rss: dict[str, int] = field(default_factory=dict)


class Engine(Protocol):
    """Runs `fn` over items and yields the results in the items' order."""

    name: str
    stats: EngineStats

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]: ...

    def close(self) -> None: ...


class LocalEngine:
    """Everything in this process, one item at a time (memory holds one item's work)."""

    name = LOCAL

    def __init__(self) -> None:
        self.stats = EngineStats()

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        for item in items:
            self.stats.tasks += 1
            yield fn(item)

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class DaskEngine:
    """Items as tasks on dask.distributed: a LocalCluster of `workers` processes (one thread each) when no
    `address` is given, else the scheduler at `address`. At most `ahead` tasks per worker are in flight, so the
    caller never holds more than that many results however many items there are."""

    name = DASK

    def __init__(self, address: str | None = None, *, workers: int | None = None, ahead: int = 2,
                 memory_limit: str | None = None) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise EngineError("the dask engine needs dask.distributed: pip install 'stallwatch[dask]'") from None
        self.address = address
        self.stats = EngineStats()
        self._cluster = None
        try:
            if address is None:
                n = workers or max(1, min(os.cpu_count() or 1, 4))
                self._cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                             dashboard_address=None, memory_limit=memory_limit or "auto")
                self.client = Client(self._cluster)
            else:
                self.client = Client(address, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            if self._cluster is not None:
                self._cluster.close()
            where = f"the Dask scheduler at {address}" if address else "a local Dask cluster"
            raise EngineError(f"cannot reach {where}: {_one_line(exc)}") from None
        self._ahead = max(1, ahead)

    def workers(self) -> int:
        return max(1, len(self.client.scheduler_info().get("workers", {})))

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        window = self._ahead * self.workers()
        pending: deque[Any] = deque()
        items = iter(items)
        try:
            while True:
                while len(pending) < window:
                    item = next(items, _END)
                    if item is _END:
                        break
                    pending.append(self.client.submit(fn, item, pure=False))
                if not pending:
                    return
                future = pending.popleft()
                result = self._result(future)
                self.stats.tasks += 1
                self.stats.result_bytes += payload_bytes(result)
                future.release()
                yield result
        finally:
            for future in pending:
                future.cancel()

    def _result(self, future: Any) -> Any:
        """The task's result, waited for while the cluster can still give it: an EngineError, in bounded time,
        when it has had no worker for `NO_WORKER_S` (the tasks would wait forever) or has lost its scheduler.
        What the task itself raised is raised as it is."""
        from concurrent.futures import CancelledError

        no_worker_since: float | None = None
        lost_since: float | None = None
        where = f"the Dask scheduler at {self.address}" if self.address else "the local Dask cluster"
        while True:
            try:
                return future.result(timeout=POLL_S)
            except TimeoutError:
                pass
            except CancelledError:  # the scheduler went, and its tasks with it (FuturesCancelledError)
                raise EngineError(f"lost {where}: its tasks were cancelled (did the scheduler stop?); start it "
                                  "again, or use --engine local") from None
            except OSError as exc:  # CommClosedError and the like
                raise EngineError(f"lost {where}: {_one_line(exc)}; use --engine local") from None
            now = time.monotonic()
            if self.client.status != "running":
                lost_since = lost_since or now
                if now - lost_since >= LOST_SCHEDULER_S:
                    raise EngineError(f"lost {where} ({self.client.status} for {now - lost_since:.0f} s); start "
                                      "it again, or use --engine local")
                continue
            lost_since = None
            if self.client.scheduler_info().get("workers"):
                no_worker_since = None
            else:
                no_worker_since = no_worker_since or now
                if now - no_worker_since >= NO_WORKER_S:
                    raise EngineError(f"{where} has had no worker for {now - no_worker_since:.0f} s, so nothing "
                                      "can be evaluated: start workers for it (dask worker ADDRESS), or use "
                                      "--engine local")

    def worker_peak_rss(self) -> dict[str, int]:
        """Each worker's peak resident memory so far (VmHWM), bytes; also kept in `stats`."""
        peaks = self.client.run(_peak_rss)
        self.stats.worker_peak_rss = {str(k): int(v) for k, v in peaks.items()}
        return self.stats.worker_peak_rss

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()

    def __enter__(self) -> DaskEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_END = object()


def shared_uri(uri: str) -> str:
    """The run's URI as a worker elsewhere reads it: an object-store URI as it is, a local path made absolute
    (a worker's working directory is not the caller's)."""
    return uri if "://" in uri else os.path.abspath(uri)


def on_run(engine: Engine, run: Any, local: Callable[..., T], task: Callable[..., T]) -> Callable[..., T]:
    """Per-node work for `engine`: `local` on the open run in this process, else `task` on the run's shared URI
    (a worker opens the run itself; the open run does not travel). The one place the engine's kind is asked."""
    return partial(local, run) if engine.name == LOCAL else partial(task, shared_uri(run.uri))


def parse_engine(spec: str | None) -> tuple[str, str | None]:
    """`local`, `dask` or `dask=ADDRESS` -> (name, address); EngineError for anything else."""
    text = (spec or LOCAL).strip()
    name, sep, address = text.partition("=")
    name = name.strip().lower()
    if name == LOCAL and not sep:
        return LOCAL, None
    if name == DASK:
        address = address.strip()
        if sep and not address:
            raise EngineError("--engine dask=ADDRESS: give the scheduler's address, e.g. dask=tcp://10.0.0.5:8786")
        return DASK, address or None
    raise EngineError(f"unknown engine {text!r}: use local, dask (a local Dask cluster) or dask=SCHEDULER_ADDRESS")


def open_engine(spec: str | Engine | None = None, **options: Any) -> Engine:
    """The engine `spec` names (an Engine is returned as it is)."""
    if spec is not None and not isinstance(spec, str):
        return spec
    name, address = parse_engine(spec)
    return LocalEngine() if name == LOCAL else DaskEngine(address, **options)


def payload_bytes(obj: Any, _depth: int = 0) -> int:
    """The bytes of arrays and Arrow tables in `obj` (through tuples, lists, dicts and plain objects): about
    what sending it costs, counted without serializing it again."""
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int) and not isinstance(obj, type):
        return nbytes
    if _depth > 8:
        return 0
    if isinstance(obj, dict):
        return sum(payload_bytes(k, _depth + 1) + payload_bytes(v, _depth + 1) for k, v in obj.items())
    if isinstance(obj, (tuple, list)):
        return sum(payload_bytes(v, _depth + 1) for v in obj)
    if isinstance(obj, (str, bytes)):
        return len(obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return payload_bytes(vars(obj), _depth + 1)
    return 8


def _peak_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:299] + "…"
