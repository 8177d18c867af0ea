"""Dataloader: are there about as many data-loader worker processes as CPU cores?"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallwatch.analyze.contention import own_waits, step_runq, wait_runq
from stallwatch.analyze.finding import MEDIUM, Finding, Where, finding
from stallwatch.analyze.framework_frame import new_events, unmeasured_waits
from stallwatch.analyze.rules.base import Chunk, ParameterError, Rule, RuleResult
from stallwatch.analyze.rules.kit import loaders as ld
from stallwatch.analyze.rules.kit.appendable import Appendable
from stallwatch.analyze.rules.kit.details import DetailsRecord
from stallwatch.analyze.rules.kit.stats import Distribution, ValueCounts
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import DATA_WAIT, PROC, STEP, TRAIN, WORKERS_ALIVE

PIN_MEMORY_ADVICE = ("Set pin_memory=True in the DataLoader: pinned host memory makes copies to the GPU faster and "
                     "lets them overlap with compute.")

DATALOADER = "dataloader"
MAX_LOADERS = 50  # loaders listed in Details
HISTOGRAM_BINS = 50
US = 1_000_000
_SETTINGS = ("created_at", "batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "drop_last",
             "timeout", "sampler", "multiprocessing_context", "dataset",
             # a Keras job's input (stallwatch.keras): PyDataset, generator, tf.data, arrays or a DataLoader
             "framework", "input", "loop", "worker_threads", "use_multiprocessing", "max_queue_size", "prefetch",
             "in_memory")


@dataclass(frozen=True)
class LoaderNode(DetailsRecord):
    """One node, Details["nodes"][node]: its cores and ranks, the workers running in parallel (median) and as % of
    its cores, the most alive at once, the worst rank's data wait (% of step time), where the worker count came
    from, the num_workers to try, whether it fired and why ("below", "above", "slow_fetch", "not_a_bottleneck")."""

    cores: int | None = None
    ranks: int | None = None
    dataloaders: float | None = None
    percent: float | None = None
    max_alive: float | None = None
    wait_share: float | None = None
    source: str | None = None
    suggested_num_workers: int | None = None
    triggered: bool = False
    reason: str | None = None


@dataclass(frozen=True)
class LoaderSettings(DetailsRecord):
    """One DataLoader as built: where, its data set, when (text), the mode of the steps that waited for it, and its
    settings; `iterators`: how many times it was iterated."""

    node: str | None = None
    rank: int | None = None
    dataset: str | None = None
    created_at: str | None = None
    mode: str | None = None
    batch_size: int | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    iterators: int | None = None


@dataclass(frozen=True)
class WaitHistogram(DetailsRecord):
    """The waits for a batch (s): how many, in which mode's steps, quartiles, p95, max and a histogram (`probs` over
    `binedges`)."""

    mode: str | None = None
    count: int = 0
    p25: float | None = None
    p50: float | None = None
    p95: float | None = None
    max: float | None = None
    probs: list[float] = field(default_factory=list)
    binedges: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class DataloaderDetails(DetailsRecord):
    """Dataloader's Details: per node, the loaders listed (and how many), the histogram of waits, whether data
    loading was a bottleneck at all, the settings seen (pin_memory and prefetching everywhere), and each node's
    data wait (% of step time, worst rank)."""

    rule = "Dataloader"
    nodes: dict[str, LoaderNode] = field(default_factory=dict)
    loaders: list[LoaderSettings] = field(default_factory=list)
    loaders_total: int | None = None
    dataloading_time: WaitHistogram = field(default_factory=WaitHistogram)
    bottleneck: bool | None = None
    pin_memory: bool | None = None
    prefetch: bool | None = None
    wait_share: dict[str, float | None] = field(default_factory=dict)


class Dataloader(Rule):
    """Per node: the number of data-loader worker processes running in parallel is the median of the
    `proc/workers_alive` snapshots taken during the node's training loop (from its first step's start to its
    last step's end; all snapshots when it has no steps). Where the snapshots lack that metric, it is the sum
    over the node's ranks of each rank's median `num_workers` over its `dataloader` events.

    The rule judges the loader only where the training loop measurably waited for it: a node fires when a typical
    (median) TRAIN step of one of its ranks spent more than `wait_threshold` % of its time waiting for the next
    batch — a few long stalls do not count here, more workers would not remove them (InputBound names them) — and then
    says why: workers below `min_threshold` % of the cores (`below`; none at all is loading in the main
    process), above `max_threshold` % (`above`: they compete with training for the CPU), or enough workers that
    still cannot keep up (`slow_fetch`). Below the wait threshold the loader is not a bottleneck whatever its
    worker count: an in-memory dataset with num_workers=0 is fine, and more workers would only cost memory.
    Nor is it when the median wait for a batch is under `min_wait_ms` (a tiny model on in-memory data spends a
    large share of a very short step fetching, but a worker's hand-over costs as much as it would save).

    Evaluation points: one per node, on all of its data (the median needs all of it). RuleTriggered =
    Violations = nodes that fire; Datapoints = the samples of the worker count (snapshots, or dataloader
    events where snapshots lack it). Not applicable without framework data, or when the job created no
    DataLoader iterator (no `dataloader` events): then there is no data loader to judge."""

    name = "Dataloader"
    metrics = (WORKERS_ALIVE,)
    description = ("Checks how many data loaders are running in parallel and whether the total number is equal the "
                   "number of available CPU cores. The rule triggers if number is much smaller or larger than the "
                   "number of available cores. If too small, it might lead to low GPU utilization. If too large, it "
                   "might impact other compute intensive operations on CPU.")
    recommendation = "Change the number of data loader processes."
    # min_wait_ms: a typical wait for a batch shorter than this is not worth worker processes (handing a batch
    # over from a worker costs about as much): an in-memory TensorDataset feeding a tiny model is not a finding.
    defaults = {"min_threshold": 70, "max_threshold": 200, "wait_threshold": 20, "min_wait_ms": 1.0}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        for key in ("min_threshold", "max_threshold", "wait_threshold", "min_wait_ms"):
            value = self.params[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ParameterError(f"{self.name}.{key}={value!r}: must be a number >= 0")
        if self.params["min_threshold"] > self.params["max_threshold"]:
            raise ParameterError(f"{self.name}: min_threshold ({self.params['min_threshold']}) must not exceed "
                                 f"max_threshold ({self.params['max_threshold']})")
        self._run: dict[str, Any] = {}
        self._events = 0
        self._info: dict[str, dict[str, Any]] = {}
        self._alive: dict[str, _SpanMedian] = {}  # node -> its workers_alive snapshots
        self._span: dict[str, list[int]] = {}  # node -> [first step start, last step end]
        self._ranks: dict[str, set[int]] = {}
        self._loaders: dict[tuple[str, int, str], dict[str, Any]] = {}
        self._rank_workers: dict[tuple[str, int], list[float]] = {}
        self._loader_waits: dict[tuple[str, int, str], dict[int, list[int]]] = {}  # per mode: loader key -> [µs, n]
        # µs, whole-run; held as distinct values and counts (bounded by the waits' range, not their number)
        self._waits_train = ValueCounts()  # TRAIN steps' waits
        self._waits_other = ValueCounts()  # the others': judged only when there are no TRAIN
        # (node, rank) -> [µs waiting for data, µs of steps], TRAIN steps and the others apart
        self._share_train: dict[tuple[str, int], list[int]] = {}
        self._share_other: dict[tuple[str, int], list[int]] = {}
        # (node, rank) -> each step's wait as % of that step (TRAIN; the others apart): its median is the
        # typical step's, which a few long stalls do not move (those are InputBound's, not the workers')
        self._step_share_train: dict[tuple[str, int], Distribution] = {}
        self._step_share_other: dict[tuple[str, int], Distribution] = {}
        # nodes whose data is complete: their worker counts and their ranks' typical shares, reduced
        self._workers_done: dict[str, dict[str, Any] | None] = {}
        self._typical_done: dict[tuple[str, int], float | None] = {}
        self._unmeasured: set[tuple[str, int]] = set()  # ranks whose data wait is not recorded (Keras on TF)

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        self._add(chunk)
        for node in chunk.done:
            self._close(node)

    def _close(self, node: str) -> None:
        """The node's data is complete: reduce its worker-count snapshots and its ranks' per-step shares to the
        figures `result()` reads (a median each), and drop them."""
        self._workers_done[node] = self._node_workers(node)
        self._alive.pop(node, None)
        for key in [k for k in set(self._step_share_train) | set(self._step_share_other) if k[0] == node]:
            self._typical_done[key] = self._typical(key)
            self._step_share_train.pop(key, None)
            self._step_share_other.pop(key, None)

    def merge(self, other: Rule, node: str) -> None:
        """`other` was fed only `node`'s rows: its per-node and per-(node, rank) entries are that node's (kept as
        they are, or combined as later chunks of the same node would be), and the whole-run waits add up."""
        assert isinstance(other, Dataloader)
        self._run = other._run or self._run
        self._events += other._events
        self._info.update(other._info)  # every chunk carries every node's record: the same values
        for name, alive in other._alive.items():  # a node not yet closed (never after its `done`)
            if name in self._alive:
                self._alive[name].merge(alive)
            else:
                self._alive[name] = alive
        for name, (lo, hi) in other._span.items():
            span = self._span.setdefault(name, [lo, hi])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
        for name, ranks in other._ranks.items():
            self._ranks.setdefault(name, set()).update(ranks)
        for key, entry in other._loaders.items():
            mine = self._loaders.get(key)
            if mine is None:
                self._loaders[key] = entry
            elif entry["first_us"] < mine["first_us"]:  # an earlier iterator's settings win; ties: the first fed
                self._loaders[key] = dict(entry, iterators=mine["iterators"] + entry["iterators"])
            else:
                mine["iterators"] += entry["iterators"]
        for rank, workers in other._rank_workers.items():
            self._rank_workers.setdefault(rank, []).extend(workers)
        ld.merge_waits(self._loader_waits, other._loader_waits)
        self._waits_train.merge(other._waits_train)
        self._waits_other.merge(other._waits_other)
        for shares, theirs in ((self._share_train, other._share_train), (self._share_other, other._share_other)):
            for rank, (wait, steps) in theirs.items():
                acc = shares.setdefault(rank, [0, 0])
                acc[0] += wait
                acc[1] += steps
        for dists, their_dists in ((self._step_share_train, other._step_share_train),
                                   (self._step_share_other, other._step_share_other)):
            for rank, dist in their_dists.items():  # open ranks only: a closed node's are in _typical_done
                if rank in dists:
                    dists[rank].merge(dist)
                else:
                    dists[rank] = dist
        self._workers_done.update(other._workers_done)
        self._typical_done.update(other._typical_done)
        self._unmeasured |= other._unmeasured

    def _add(self, chunk: Chunk) -> None:
        self._run = chunk.run or self._run
        for node, frame in chunk.system.items():
            if frame.info:
                self._info[node] = frame.info
            alive = frame.get(PROC, WORKERS_ALIVE)
            if alive is None or not len(frame):
                continue
            ok = ~np.isnan(alive)
            if ok.any():
                self._alive.setdefault(node, _SpanMedian()).add(frame.timestamps[ok].astype(np.int64), alive[ok])
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        table = cols.table
        self._unmeasured |= unmeasured_waits(cols, table)
        for code in np.flatnonzero(np.bincount(cols.node)).tolist():  # the ranks with events on each node
            ranks = np.flatnonzero(np.bincount(cols.rank[cols.node == code].clip(0)))
            self._ranks.setdefault(cols.nodes[code], set()).update(ranks.tolist())
        is_step = cols.kind_is(STEP)
        for (node, _), rows in cols.groups(is_step, by_mode=False):
            lo, hi = int(cols.start[rows].min()), int(cols.end[rows].max())
            span = self._span.setdefault(node, [lo, hi])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
        waits = cols.kind_is(DATA_WAIT)
        ld.add_waits(self._loader_waits, cols, waits)
        if waits.any():
            dur = np.maximum(cols.end[waits] - cols.start[waits], 0)
            train = cols.mode_is([TRAIN])[waits]
            self._waits_train.add(dur[train])
            self._waits_other.add(dur[~train])
        in_train = cols.mode_is([TRAIN])
        duration = np.maximum(cols.end - cols.start, 0)
        for kind, slot in ((DATA_WAIT, 0), (STEP, 1)):
            for mask, shares in ((in_train, self._share_train), (~in_train, self._share_other)):
                for (node, rank), rows in cols.groups(cols.kind_is(kind) & mask, by_mode=False):
                    shares.setdefault((node, rank), [0, 0])[slot] += int(duration[rows].sum())
        for mask, dists in ((in_train, self._step_share_train), (~in_train, self._step_share_other)):
            waits_by_rank = dict(cols.groups(cols.kind_is(DATA_WAIT) & mask & (cols.step >= 0), by_mode=False))
            for key, rows in cols.groups(cols.kind_is(STEP) & mask & (cols.step >= 0), by_mode=False):
                step_shares = _step_shares(cols.step[rows], duration[rows], cols.step, duration, waits_by_rank.get(key),
                                           step_runq(cols, rows), wait_runq(cols, rows))
                dists.setdefault(key, Distribution(2, np.float64)).add(step_shares)
        loaders = np.flatnonzero(cols.kind_is(DATALOADER))
        if loaders.size:
            args = table["args"].take(loaders).to_pylist()
            names = table["name"].take(loaders).to_pylist()
            for j, i in enumerate(loaders.tolist()):
                self._loader_event(cols.nodes[cols.node[i]], int(cols.rank[i]), str(names[j]), int(cols.start[i]),
                                   args[j])

    def _loader_event(self, node: str, rank: int, name: str, at: int, text: str) -> None:
        try:
            args = json.loads(text) if text else {}
        except ValueError:
            args = {}
        if not isinstance(args, dict):
            args = {}
        key = args.get("key")  # the loader's own number (its data waits name it); older runs: its id()
        loader = str(key if isinstance(key, int) and not isinstance(key, bool) else args.get("loader_id", name))
        key = (node, rank, loader)
        entry = self._loaders.get(key)
        if entry is None or at < entry["first_us"]:  # settings as of the loader's first iterator
            settings = {k: args.get(k) for k in _SETTINGS if k in args}
            settings.setdefault("dataset", name)
            self._loaders[key] = entry = {"node": node, "rank": rank, "loader_id": loader, **settings,
                                          "iterators": entry["iterators"] if entry else 0, "first_us": at}
        entry["iterators"] += 1
        workers = args.get("num_workers")
        if isinstance(workers, (int, float)) and not isinstance(workers, bool):
            self._rank_workers.setdefault((node, rank), []).append(float(workers))

    def _in_memory(self, node: str) -> bool:
        """Every input this node's loops read was a Keras one held in memory (NumPy arrays)."""
        mine = [e for e in self._loaders.values() if e["node"] == node]
        return bool(mine) and all(e.get("framework") == "keras" and e.get("in_memory") for e in mine)

    def _cores(self, node: str) -> int | None:
        info = self._info.get(node) or (self._run.get("nodes") or {}).get(node) or {}
        cores = info.get("cpu_cores_logical")
        return int(cores) if isinstance(cores, (int, float)) and cores > 0 else None

    def _has_gpus(self, node: str) -> bool:
        info = self._info.get(node) or (self._run.get("nodes") or {}).get(node) or {}
        return bool(info.get("gpus"))

    def result(self) -> RuleResult:
        if self._events == 0:
            return self.not_applicable("no framework data: the job's data loading was not recorded (was it run "
                                       "under `stallwatch run` with PyTorch?)")
        if not self._loaders:
            return self.not_applicable("the job created no DataLoader iterator (no `dataloader` events), so there are "
                                       "no data-loader workers to judge")
        if self._unmeasured and self._waits_train.n == 0 and self._waits_other.n == 0:
            return self.not_applicable("the job's steps do not record their wait for data (Keras on TensorFlow "
                                       "reads its input inside the compiled train step), so the loader's effect "
                                       "cannot be judged")
        lo_pct, hi_pct = float(self.params["min_threshold"]), float(self.params["max_threshold"])
        wait_pct = float(self.params["wait_threshold"])
        shares = self.wait_shares()
        typical = self.typical_wait_shares()
        material = {n for (n, _), v in typical.items() if v is not None and v > wait_pct}
        waits = self._waits_train if self._waits_train.n else self._waits_other
        median_wait_ms = float(waits.percentiles((50,))[0]) / 1000 if waits.n else None
        if median_wait_ms is not None and median_wait_ms < float(self.params["min_wait_ms"]):
            material = set()  # batches arrive within a millisecond: no worker count would make that faster
        self._attribute()
        nodes: dict[str, dict[str, Any]] = {}
        triggered = datapoints = 0
        for node in sorted(set(self._alive) | set(self._workers_done) | {k[0] for k in self._loaders}):
            entry = self._node_workers(node) if node not in self._workers_done else \
                dict(self._workers_done[node] or {}) or None  # a copy: the entry is completed below
            if entry is None:
                continue
            cores = self._cores(node)
            entry["cores"] = cores
            ranks = len(self._ranks.get(node, ())) or 1
            entry["ranks"] = ranks
            node_shares = [v for (n, _), v in shares.items() if n == node and v is not None]
            entry["wait_share"] = max(node_shares) if node_shares else None
            if self._in_memory(node):
                # Keras slicing NumPy arrays held in memory: there are no loader workers to tune
                entry.update(percent=None if cores is None else 100.0 * entry["dataloaders"] / cores,
                             triggered=False, reason="in_memory")
            elif cores is None:
                entry.update(percent=None, triggered=node in material,
                             reason="slow_fetch" if node in material else "not_a_bottleneck")
            else:
                pct = 100.0 * entry["dataloaders"] / cores
                fires = node in material
                reason = ("below" if pct < lo_pct else "above" if pct > hi_pct else "slow_fetch") if fires \
                    else "not_a_bottleneck"
                suggest = ld.suggested_workers(cores, ranks) or 1
                judged = self._judged_workers(node)
                entry["num_workers"] = judged
                if reason == "below" and judged is not None and suggest <= judged:
                    reason = "slow_fetch"  # never advise the count a loader has, or fewer
                entry.update(percent=pct, triggered=fires, reason=reason, suggested_num_workers=suggest)
            triggered += int(entry["triggered"])
            datapoints += entry["samples"]
            nodes[node] = entry
        if not nodes:
            return self.not_applicable("no worker count: neither `proc/workers_alive` snapshots nor `num_workers` "
                                       "in the dataloader events")
        loaders = sorted(self._loaders.values(), key=lambda e: (e["node"], e["rank"], e["first_us"], e["loader_id"]))
        judged = _judged(loaders)
        main = _main_loader(judged)
        head = next((e for e in nodes.values() if e["triggered"]), None) or next(iter(nodes.values()))
        details: dict[str, Any] = {
            "cores": head["cores"],
            "dataloaders": head["dataloaders"],
            "num_workers": main.get("num_workers"),
            "pin_memory": all(bool(e.get("pin_memory")) for e in judged),
            "prefetch": any(bool(e.get("prefetch")) if e.get("framework") == "keras"
                            else (e.get("num_workers") or 0) > 0 and (e.get("prefetch_factor") or 0) > 0
                            for e in judged),
            "keras": any(e.get("framework") == "keras" for e in loaders),
            "prefetch_factor": main.get("prefetch_factor"),
            "batch_size": main.get("batch_size"),
            "nodes": nodes,
            "loaders": [{k: v for k, v in e.items() if k != "first_us"} for e in loaders[:MAX_LOADERS]],
            "loaders_total": len(loaders),
            "wait_share": {f"{n}/{r}": v for (n, r), v in sorted(shares.items())},
            "typical_wait_share": {f"{n}/{r}": v for (n, r), v in sorted(typical.items())},
            "wait_threshold": wait_pct,
            "bottleneck": bool(material),
            "median_wait_ms": median_wait_ms,
        }
        timing = self._dataloading_time()
        if timing:
            details["dataloading_time"] = timing
        return self.make_result(triggered=triggered, violations=triggered, datapoints=datapoints, details=details,
                                recommendation=self._advice(nodes, details))

    def _attribute(self) -> None:
        """Each loader's mode and wait, where its data waits name it (runs since loaders have a `key`)."""
        modes = ld.loader_modes(self._loader_waits)
        waited: dict[tuple[str, int, int], int] = {}
        for (node, rank, _), per in self._loader_waits.items():
            for loader, (us, _) in per.items():
                waited[(node, rank, loader)] = waited.get((node, rank, loader), 0) + us
        for e in self._loaders.values():
            if not e["loader_id"].lstrip("-").isdigit():
                continue
            k = (e["node"], e["rank"], int(e["loader_id"]))
            if k in modes:
                e["mode"], e["wait_s"] = modes[k], waited.get(k, 0) / US

    def _judged_workers(self, node: str) -> float | None:
        """The most workers a loader the node's (training) loop waited for has: what the advice must exceed."""
        counts = [float(e["num_workers"]) for e in _judged([x for x in self._loaders.values() if x["node"] == node])
                  if isinstance(e.get("num_workers"), (int, float)) and not isinstance(e.get("num_workers"), bool)]
        return max(counts) if counts else None

    def _node_workers(self, node: str) -> dict[str, Any] | None:
        alive = self._alive.get(node)
        if alive is not None:
            values = alive.within(self._span.get(node))
            return {"dataloaders": values.percentiles((50,))[0], "source": "proc/workers_alive",
                    "samples": int(values.n), "max_alive": values.max()}
        medians = [float(np.median(v)) for (n, _), v in sorted(self._rank_workers.items()) if n == node and v]
        if not medians:
            return None
        samples = sum(len(v) for (n, _), v in self._rank_workers.items() if n == node)
        return {"dataloaders": float(sum(medians)), "source": "dataloader events (num_workers)",
                "samples": samples, "max_alive": None}

    def wait_shares(self) -> dict[tuple[str, int], float | None]:
        """Per (node, rank): the % of its step time spent waiting for data, over its TRAIN steps (over all its
        steps when it had none); None without step time."""
        out: dict[tuple[str, int], float | None] = {}
        for key in sorted(set(self._share_train) | set(self._share_other)):
            wait, steps = self._share_train.get(key) or [0, 0]
            if steps == 0:
                wait, steps = self._share_other.get(key) or [0, 0]
            out[key] = 100.0 * wait / steps if steps > 0 else None
        return out

    def typical_wait_shares(self) -> dict[tuple[str, int], float | None]:
        """Per (node, rank): the median over its (TRAIN) steps of each step's wait as % of that step."""
        out = dict(self._typical_done)
        for key in set(self._step_share_train) | set(self._step_share_other):
            out[key] = self._typical(key)
        return dict(sorted(out.items()))

    def _typical(self, key: tuple[str, int]) -> float | None:
        dist = self._step_share_train.get(key)
        if dist is None or dist.n == 0:
            dist = self._step_share_other.get(key)
        return float(dist.percentiles((50,))[0]) if dist is not None and dist.n else None

    def _dataloading_time(self) -> dict[str, Any]:
        waits, mode = self._waits_train, TRAIN
        if waits.n == 0:  # then every wait is another phase's
            waits, mode = self._waits_other, "all"
        if waits.n == 0:
            return {}
        p25, p50, p95 = (x / US for x in waits.percentiles((25, 50, 95)))
        counts, edges = waits.histogram(HISTOGRAM_BINS)
        return {"p25": p25, "p50": p50, "p95": p95, "max": waits.max() / US, "count": int(waits.n), "mode": mode,
                "probs": (counts / counts.sum()).tolist(), "binedges": (edges / US).tolist()}

    def _advice(self, nodes: dict[str, dict[str, Any]], details: dict[str, Any]) -> str:
        wait_pct = float(self.params["wait_threshold"])
        if all(e.get("reason") == "in_memory" for e in nodes.values()):
            return ("The input is held in memory (NumPy arrays that Keras slices into batches): there are no "
                    "data-loader workers to tune.")
        if not details["bottleneck"]:
            shares = [v for v in details["typical_wait_share"].values() if v is not None]
            most = f"at most {max(shares):.1f} %" if shares else "no measurable share"
            fast = details.get("median_wait_ms")
            if shares and max(shares) > wait_pct and fast is not None and fast < float(self.params["min_wait_ms"]):
                return (f"The data loader's workers are not what to change: a typical step waited for data {most} of "
                        f"its time, but each batch came in {fast:.2f} ms (under min_wait_ms "
                        f"{_num(float(self.params['min_wait_ms']))} ms), less than handing a batch over from a worker "
                        "process costs.")
            return (f"The data loader is not a bottleneck: a typical training step waited for data {most} of its "
                    f"time (threshold {_num(wait_pct)} %), so no change to the workers is needed; more workers would "
                    "only cost memory.")
        lines = [self.recommendation]
        for node, e in nodes.items():
            if not e["triggered"]:
                continue
            waited = f" while the training loop waited for data {e['wait_share']:.0f} % of its step time" \
                if e.get("wait_share") is not None else ""
            if details["keras"]:
                lines.append(f"Node {node}{waited}: {_keras_line(e, details)}")
                continue
            if e["reason"] == "slow_fetch":
                lines.append(f"Node {node} ran {_num(e['dataloaders'])} data-loader workers{waited}: the workers are "
                             "enough for the cores but cannot keep up. Make each batch cheaper to produce (decode "
                             "and augment less per sample, pre-process the data set once, read from faster "
                             "storage), or raise prefetch_factor to smooth uneven batches.")
                continue
            per_rank = f" per rank ({e['ranks']} ranks share the node)" if e["ranks"] > 1 else ""
            workers = _num(e["dataloaders"])
            if e["reason"] == "below":
                lines.append(f"Node {node} ran {workers} data-loader workers in parallel on {e['cores']} CPU cores "
                             f"({e['percent']:.0f} %, below {_num(self.params['min_threshold'])} %){waited}: try "
                             f"num_workers={e['suggested_num_workers']}{per_rank}.")
            else:
                lines.append(f"Node {node} ran {workers} data-loader workers in parallel on {e['cores']} CPU cores "
                             f"({e['percent']:.0f} %, above {_num(self.params['max_threshold'])} %){waited}: they "
                             "compete with the training processes for the CPU; try "
                             f"num_workers={e['suggested_num_workers']}{per_rank}.")
        gpu_nodes = any(self._has_gpus(n) for n in nodes)
        if details["keras"]:
            return " ".join(lines)
        if gpu_nodes and not details["pin_memory"]:
            lines.append(PIN_MEMORY_ADVICE)
        if not details["prefetch"]:
            lines.append("The data was not prefetched (num_workers=0 loads each batch in the training process when "
                         "it is needed): use worker processes (num_workers > 0, prefetch_factor >= 2) so batches "
                         "are ready ahead of time.")
        return " ".join(lines)


def _keras_line(e: dict[str, Any], details: dict[str, Any]) -> str:
    """The Dataloader advice for a Keras input: PyDataset workers and processes, tf.data's own parallelism."""
    keras = [x for x in details["loaders"] if x.get("framework") == "keras"]
    fit: dict[str, Any] | None = next((x for x in keras if x.get("loop") != "test"), None)
    main: dict[str, Any] = fit or next(iter(keras), {})
    kind, cores = main.get("input"), e.get("cores")
    suggest = e.get("suggested_num_workers") or 2
    if kind == "tf_data":
        return ("tf.data makes the batches with its own threads: parallelize its map (num_parallel_calls="
                "tf.data.AUTOTUNE) and end the pipeline with .prefetch(tf.data.AUTOTUNE).")
    if kind == "generator":
        return (f"Keras draws batches from a Python generator in the training thread: rewrite it as a "
                f"keras.utils.PyDataset with workers={suggest}, use_multiprocessing=True.")
    threads = main.get("worker_threads") or 0
    procs = f"{_num(e['dataloaders'])} worker process{'' if e['dataloaders'] == 1 else 'es'}"
    configured = main.get("num_workers")
    if isinstance(configured, (int, float)) and configured and configured != e["dataloaders"]:
        procs += f" alive in the median (workers={_num(configured)} configured)"
    if e["reason"] == "below":
        made = (f"{threads} worker threads (sharing the interpreter lock with training)" if threads else
                procs if e["dataloaders"] else "the training thread itself")
        return (f"the PyDataset's batches were made by {made} on {cores} CPU cores: pass workers={suggest}, "
                "use_multiprocessing=True to its super().__init__.")
    if e["reason"] == "above":
        return (f"{procs} of the PyDataset on {cores} CPU cores compete with training for the CPU: try "
                f"workers={suggest}.")
    return ("the PyDataset's workers are enough for the cores but cannot keep up: make __getitem__ cheaper "
            "(decode and augment less, pre-process the data once, faster storage) or raise max_queue_size.")


def _step_shares(numbers: np.ndarray, durations: np.ndarray, all_steps: np.ndarray, all_durations: np.ndarray,
                 wait_rows: np.ndarray | None, runq: np.ndarray | None = None,
                 in_wait: np.ndarray | None = None) -> np.ndarray:
    """Each step's wait as % of the step (0.01 % resolution, at most 100), from the waits of the same rank
    with the same step number in this chunk (a step's events arrive together); with `runq`, of the step's own
    time, less its wait for a CPU (`in_wait`: the part measured in the wait; analyze/contention.py)."""
    waited = np.zeros(len(numbers), np.int64)
    if wait_rows is not None and len(wait_rows):
        order = np.argsort(numbers, kind="stable")
        pos = np.searchsorted(numbers[order], all_steps[wait_rows])
        pos = np.minimum(pos, len(order) - 1)
        hit = numbers[order][pos] == all_steps[wait_rows]
        np.add.at(waited, order[pos[hit]], all_durations[wait_rows][hit])
    if runq is not None and runq.any():
        durations, waited, _ = own_waits(durations, np.minimum(waited, durations), runq, in_wait)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(durations > 0, np.minimum(100.0 * waited / np.maximum(durations, 1), 100.0), 0.0)
    return np.round(share, 2)


class _SpanMedian:
    """A node's worker-count snapshots, for their statistics within the training loop's span, which grows as
    steps arrive: the snapshots newly inside it are added to a Distribution, so a live result costs little."""

    def __init__(self) -> None:
        self.ts, self.values = Appendable(), Appendable(np.float64)
        self._dist = Distribution(None, np.float64)
        self._covered = (0, 0)  # the index range of `ts` in _dist
        self._ordered = True

    def add(self, ts: np.ndarray, values: np.ndarray) -> None:
        if self.ts.n and len(ts) and ts[0] < self.ts.view()[-1] or len(ts) > 1 and (np.diff(ts) < 0).any():
            self._ordered = False
        self.ts.extend(ts)
        self.values.extend(values.astype(np.float64))

    def merge(self, other: _SpanMedian) -> None:
        """`other`'s snapshots after these, as if added here (an out-of-order join is noticed by `add`)."""
        self.add(other.ts.view(), other.values.view())

    def within(self, span: list[int] | None) -> Distribution:
        """The values of the snapshots within `span` (all of them when it is None or holds none)."""
        if not self._ordered:  # snapshots came out of time order (rare): order them once
            order = np.argsort(self.ts.view(), kind="stable")
            ts, values = self.ts.view()[order], self.values.view()[order]
            self.ts, self.values = Appendable(), Appendable(np.float64)
            self.ts.extend(ts)
            self.values.extend(values)
            self._ordered, self._covered, self._dist = True, (0, 0), Distribution(None, np.float64)
        ts = self.ts.view()
        lo, hi = 0, len(ts)
        if span is not None:
            a, b = int(np.searchsorted(ts, span[0], "left")), int(np.searchsorted(ts, span[1], "right"))
            if b > a:
                lo, hi = a, b
        c_lo, c_hi = self._covered
        values = self.values.view()
        if c_hi == c_lo or lo > c_lo or hi < c_hi:  # the span shrank or moved: count afresh
            self._dist = Distribution(None, np.float64)
            self._dist.add(values[lo:hi])
        else:
            self._dist.add(values[lo:c_lo])
            self._dist.add(values[c_hi:hi])
        self._covered = (lo, hi)
        return self._dist


def _judged(loaders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The loaders the judged loop waited for: the training ones where waits name their loader (an evaluation
    loader's settings are not the training loop's), else those of the only mode seen, else all (older runs)."""
    for mode in (TRAIN, None):
        mine = [e for e in loaders if e.get("mode") is not None and (mode is None or e.get("mode") == mode)]
        if mine:
            return mine
    return loaders


def _main_loader(loaders: list[dict[str, Any]]) -> dict[str, Any]:
    """The loader settings most iterators were created with (ties: more workers, then first listed)."""
    if not loaders:
        return {}
    counts: dict[tuple, int] = {}
    first: dict[tuple, dict[str, Any]] = {}
    for e in loaders:
        key = (e.get("num_workers"), e.get("prefetch_factor"), e.get("batch_size"))
        counts[key] = counts.get(key, 0) + e["iterators"]
        first.setdefault(key, e)
    best = max(counts, key=lambda k: (counts[k], k[0] if isinstance(k[0], (int, float)) else -1))
    return first[best]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """The nodes whose loaders hold training back, each with why; the nodes' entries as the evidence (as stored)."""
    if not r.fired:
        return []
    d = DataloaderDetails.from_json(r.details)
    fired = [n for n, e in d.nodes.items() if e.triggered]
    stored = r.details["nodes"]  # this rule's own Details: the fired nodes' entries, every key, are the evidence
    nodes = {n: stored[n] for n in fired}
    why = {"below": "too few data-loader workers", "above": "too many data-loader workers",
           "slow_fetch": "data-loader workers that cannot keep up"}
    parts = [f"{why.get(str(d.nodes[n].reason), 'its data loading')} on node {n}" for n in fired]
    return [finding(r, s, "loader", "The data loader holds training back: " + "; ".join(parts[:4]), None,
                    Where(sorted(nodes)), {"nodes": nodes, "wait_share": r.details.get("wait_share")},
                    severity=MEDIUM)]
