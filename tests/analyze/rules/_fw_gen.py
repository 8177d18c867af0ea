"""Framework events (in the store's `framework_schema()`) and system snapshots for rule tests, with the
patterns a test plants: steps per rank and mode with their durations, slow steps at named step numbers,
waits for data, forward / backward / optimizer phases, dataloader iterator events, worker counts."""

from __future__ import annotations

import json
import random
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from stallwatch.analyze.rules.base import Chunk, NodeFrame, Rule
from stallwatch.analyze.judge.feed import split_by_time
from stallwatch.records import BACKWARD, DATA_WAIT, FORWARD, OPTIMIZER, STEP, TRAIN, framework_schema

T0 = 1_763_790_000_000_000  # 2025-11-22T05:40:00Z, µs
S = 1_000_000
MS = 1_000
MINUTE = 60 * S
STEP_NAMES = {"TRAIN": "train_step", "EVAL": "eval_step", "GLOBAL": "step"}


class FwGen:
    """Accumulates framework events; `table()` returns them as `Run.framework()` would (ordered by node,
    rank, start)."""

    def __init__(self) -> None:
        self._parts: list[dict[str, Any]] = []

    def events(self, node: str, rank: int, kind: str, name: str, mode: str, step: Any, start: Any, end: Any,
               args: str = "", pid: int | None = None) -> None:
        """One or many events: `step`, `start`, `end` may be arrays (the rest is the same for all)."""
        start = np.atleast_1d(np.asarray(start, np.int64))
        n = len(start)
        end = np.broadcast_to(np.asarray(end, np.int64), (n,))
        if step is None:
            steps = [None] * n
        else:
            steps = np.broadcast_to(np.asarray(step, np.int64), (n,)).tolist()
        pid = pid if pid is not None else 1000 + rank
        self._parts.append({"node": [node] * n, "rank": [rank] * n, "pid": [pid] * n,
                            "kind": [kind] * n, "name": [name] * n, "mode": [mode] * n, "step": steps,
                            "start_us": start.tolist(), "end_us": end.tolist(), "args": [args] * n})

    def steps(self, *, node: str = "algo-1", rank: int = 0, mode: str = TRAIN, n: int = 200, start_us: int = T0,
              step_us: int = 100 * MS, jitter_us: int = 1 * MS, gap_us: int = 1 * MS, first_step: int = 0,
              slow: dict[int, int] | None = None, phases: bool = True, data_wait_us: int | np.ndarray = 5 * MS,
              seed: int = 0, loader: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`n` steps back to back (`gap_us` apart), each `step_us` ± `jitter_us` (uniform, seeded) long, except
        the step numbers in `slow`, which last exactly the given µs. With `phases`, each step holds a wait for
        data (`data_wait_us`), then forward (30 %), backward (50 %) and optimizer (10 %) of the rest (TRAIN;
        EVAL and GLOBAL steps: forward only). Returns the steps' starts and ends."""
        rng = np.random.default_rng(seed)
        durations = step_us + rng.integers(-jitter_us, jitter_us + 1, n) if jitter_us else np.full(n, step_us)
        numbers = np.arange(first_step, first_step + n, dtype=np.int64)
        for number, us in (slow or {}).items():
            durations[number - first_step] = us
        starts = start_us + np.concatenate([[0], np.cumsum(durations[:-1] + gap_us)]).astype(np.int64)
        ends = starts + durations
        self.events(node, rank, STEP, STEP_NAMES[mode], mode, numbers, starts, ends)
        if phases:
            wait = np.minimum(np.broadcast_to(np.asarray(data_wait_us, np.int64), (n,)), durations)
            self.events(node, rank, DATA_WAIT, "next_batch", mode, numbers, starts, starts + wait,
                        "" if loader is None else json.dumps({"loader": loader}))
            rest = durations - wait
            f0 = starts + wait
            if mode == TRAIN:
                f1 = f0 + rest * 3 // 10
                b1 = f1 + rest * 5 // 10
                o1 = b1 + rest // 10
                self.events(node, rank, FORWARD, "Net", mode, numbers, f0, f1)
                self.events(node, rank, BACKWARD, "backward", mode, numbers, f1, b1)
                self.events(node, rank, OPTIMIZER, "SGD", mode, numbers, b1, o1)
            else:
                self.events(node, rank, FORWARD, "Net", mode, numbers, f0, f0 + rest * 8 // 10)
        return starts, ends

    def dataloader(self, *, node: str = "algo-1", rank: int = 0, at_us: int = T0, name: str = "ImageDataset",
                   loader_id: str | None = "0", num_workers: int = 4, pin_memory: bool = False,
                   prefetch_factor: int | None = 2, batch_size: int = 32, worker_pids: Iterable[int] = (),
                   key: int | None = None, created_at: str | None = None) -> None:
        """A DataLoader iterator created at `at_us` (start = end), with its settings in args."""
        args: dict[str, Any] = {"batch_size": batch_size, "num_workers": num_workers, "pin_memory": pin_memory,
                                "prefetch_factor": prefetch_factor, "persistent_workers": False, "drop_last": False,
                                "timeout": 0, "sampler": "RandomSampler", "multiprocessing_context": None,
                                "worker_pids": list(worker_pids), "dataset": name}
        if loader_id is not None:
            args["loader_id"] = loader_id
        if key is not None:  # recorded since data waits name their loader
            args.update(key=key, created_at=created_at)
        self.events(node, rank, "dataloader", name, "GLOBAL", None, at_us, at_us, json.dumps(args))

    def table(self) -> pa.Table:
        schema = framework_schema()
        if not self._parts:
            return schema.empty_table()
        cols = {f.name: [v for p in self._parts for v in p[f.name]] for f in schema}
        plain = {f.name: f.type.value_type if pa.types.is_dictionary(f.type) else f.type for f in schema}
        table = pa.table({name: pa.array(cols[name], t) for name, t in plain.items()})
        table = table.sort_by([("node", "ascending"), ("rank", "ascending"), ("start_us", "ascending")])
        return pa.table([table[f.name].cast(f.type) if pa.types.is_dictionary(f.type) else table[f.name]
                         for f in schema], schema=schema)


def snapshots(node: str, start_us: int, end_us: int, interval_us: int = 10 * S, info: dict | None = None,
              **series: Any) -> NodeFrame:
    """A node's snapshots every `interval_us` in [start_us, end_us); each keyword `device__metric` is a
    value, an array (one per snapshot) or a function of the timestamps array."""
    ts = np.arange(start_us, end_us, interval_us, dtype=np.int64)
    cols = {}
    for key, value in series.items():
        column = key.replace("__", "/")
        if callable(value):
            value = value(ts)
        cols[column] = np.broadcast_to(np.asarray(value, np.float64), ts.shape).copy()
    return NodeFrame(node, ts, cols, dict(info or {}))


def node_info(node: str = "algo-1", *, start_us: int = T0, end_us: int | None = None, cores: int = 8,
              gpus: int = 0) -> dict[str, Any]:
    return {"node": node, "start_us": start_us, "end_us": end_us, "cpu_cores_logical": cores,
            "gpus": [{"index": i} for i in range(gpus)]}


def run_info(*nodes: dict[str, Any]) -> dict[str, Any]:
    """`Run.info` of a run with these node records."""
    starts = [n["start_us"] for n in nodes if n.get("start_us") is not None]
    ends = [n["end_us"] for n in nodes if n.get("end_us") is not None]
    return {"run_id": "test", "nodes": {n["node"]: n for n in nodes},
            "start_us": min(starts) if starts else None, "end_us": max(ends) if ends else None}


def whole(framework: pa.Table | None = None, system: dict[str, NodeFrame] | None = None,
          run: dict[str, Any] | None = None) -> Chunk:
    """The whole run as one final chunk (batch)."""
    return Chunk(system or {}, framework if framework is not None else framework_schema().empty_table(),
                 run or {}, final=True)


def evaluate(cls: type[Rule], chunks: Chunk | list[Chunk], **params: Any) -> dict[str, Any]:
    rule = cls(**params)
    for c in [chunks] if isinstance(chunks, Chunk) else chunks:
        rule.update(c)
    return rule.result().to_json()


def time_range(chunk: Chunk) -> tuple[int, int]:
    lo, hi = [], []
    if chunk.framework.num_rows:
        lo.append(min(chunk.framework["start_us"].to_pylist()))
        hi.append(max(chunk.framework["start_us"].to_pylist()))
    for f in chunk.system.values():
        if len(f):
            lo.append(int(f.timestamps.min()))
            hi.append(int(f.timestamps.max()))
    return min(lo), max(hi)


def random_chunks(chunk: Chunk, pieces: int, seed: int) -> list[Chunk]:
    """The same data cut at `pieces - 1` random times (as live evaluation would hand it)."""
    lo, hi = time_range(chunk)
    rng = random.Random(seed)
    return split_by_time(chunk, [rng.randint(lo, hi + 1) for _ in range(pieces - 1)])


def assert_chunk_invariant(cls: type[Rule], chunk: Chunk, *, seeds: Iterable[int] = (1, 2, 3),
                           pieces: int = 12, **params: Any) -> dict[str, Any]:
    """Fed as one chunk and as many (random cuts), the rule ends with the same JSON; returns it."""
    batch = evaluate(cls, chunk, **params)
    for seed in seeds:
        live = evaluate(cls, random_chunks(chunk, pieces, seed), **params)
        assert json.dumps(live, sort_keys=True) == json.dumps(batch, sort_keys=True), f"seed {seed}"
    return batch


def write_events(root, table: pa.Table) -> None:
    """Framework events into the run with the store's own writer, one stream per (node, rank)."""
    from stallwatch.records import FrameworkEvent
    from stallwatch.store.framework_writer import FrameworkWriter
    from stallwatch.store.location import RunLocation

    location = RunLocation(str(root))
    rows = table.to_pylist()
    for node, rank in sorted({(r["node"], r["rank"]) for r in rows}):
        writer = FrameworkWriter(location, node, rank, flush_interval_us=20 * 1_000_000, max_bytes=1 << 30)
        for r in sorted((r for r in rows if (r["node"], r["rank"]) == (node, rank)), key=lambda r: r["start_us"]):
            writer.append(FrameworkEvent(r["kind"], r["name"], r["start_us"], r["end_us"], r["mode"], r["step"],
                                         r["pid"] or 1, r["args"] or ""))
            writer.tick(r["end_us"])
        writer.close()


def spy_replays(monkeypatch: Any) -> list[tuple[list[tuple[str, int, int]], Any]]:
    """Every reading of the run again by a batch feed (`feed.RunReplay`), as it happens: its pieces and kinds."""
    from stallwatch.analyze.judge import feed

    reads: list[tuple[list[tuple[str, int, int]], Any]] = []
    real = feed.RunReplay.__call__

    def counted(self: Any, pieces: Iterable[tuple[str, int, int]], **kw: Any) -> Any:
        pieces = list(pieces)
        reads.append((pieces, kw.get("kinds")))
        return real(self, pieces, **kw)

    monkeypatch.setattr(feed.RunReplay, "__call__", counted)
    return reads
