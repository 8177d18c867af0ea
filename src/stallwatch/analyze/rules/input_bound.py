"""InputBound: is the training loop starved of data? The share of step time each rank spent waiting for its next
batch, over the run and over sliding windows of steps, on any hardware (no GPU needed), with the cause it sees
and the time a fix could recover."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallwatch.analyze import contention
from stallwatch.analyze.finding import LISTED_STEPS, LISTED_WINDOWS, Finding, Where, finding, over_all_steps
from stallwatch.analyze.framework_frame import new_events, rank_key, unmeasured_waits
from stallwatch.analyze.rules.base import Chunk, ParameterError, Replay, Rule, RuleResult
from stallwatch.analyze.rules.dataloader import _SpanMedian
from stallwatch.analyze.rules.input_facts import MAX_NAMED, US, RankFacts, rank_facts
from stallwatch.analyze.rules.kit import loaders as ld
from stallwatch.analyze.rules.kit.appendable import Appendable
from stallwatch.analyze.rules.kit.checks import check_counts
from stallwatch.analyze.rules.kit.details import DetailsRecord
from stallwatch.analyze.rules.step_spans import track_spans
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import (
    CPU,
    CPU_UTIL,
    DATA_WAIT,
    EVAL,
    PROC,
    STEP,
    TRAIN,
    WORKERS_BUSY,
    WORKERS_ALIVE,
    WORKERS_CPU_UTIL,
    WORKERS_RUNQ_MS_PER_S,
)

DATALOADER = "dataloader"
MAX_LOADERS = 5  # loaders listed per rank and mode


_CPU = ((CPU, CPU_UTIL), (PROC, WORKERS_BUSY), (PROC, WORKERS_CPU_UTIL))  # the node's CPU the causes read


@dataclass(frozen=True)
class InputBoundDetails(DetailsRecord):
    """InputBound's Details: per rank and phase ("node/rank/PHASE") its waits and their cause (kept as stored), the
    threshold (% of step time), the time at stake (s), the nodes and ranks that fired, the stall steps named, and
    the finding's title."""

    rule = "InputBound"
    ranks: dict[str, dict[str, Any]] = field(default_factory=dict)
    threshold: float | None = None
    time_at_stake_s: float | None = None
    nodes: list[str] = field(default_factory=list)
    ranks_fired: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    title: str | None = None

    def train_wait_share(self, node: str | None = None) -> float | None:
        """The training loop's wait for data as judged (% of its steps' own time) on its most waiting rank (of
        `node`): the one figure every face quotes."""
        shares = [e.get("wait_share") for e in self.ranks.values()
                  if isinstance(e, dict) and e.get("phase") == TRAIN and (node is None or e.get("node") == node)]
        shares = [v for v in shares if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        return max(shares) if shares else None


class _Rank:
    """One rank's steps as they came: number, start, duration; and its waits by step number."""

    def __init__(self) -> None:
        self.step, self.start, self.dur = Appendable(narrow=True), Appendable(), Appendable(narrow=True)
        self.wait_step, self.wait = Appendable(narrow=True), Appendable(narrow=True)
        self.runq = Appendable(narrow=True)  # each step's run-queue delay (µs), beside its duration
        self.in_wait = Appendable(narrow=True)  # of it, the part measured in its opening wait (-1: not measured)
        self.workers: list[float] = []

    @property
    def nbytes(self) -> int:
        return sum(c._data.nbytes for c in (self.step, self.start, self.dur, self.wait_step, self.wait, self.runq,
                                               self.in_wait))

    def steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(numbers, starts, durations, waits) in step-number order (then start); waits summed per step."""
        return self.steps_and_runq()[:4]

    def steps_and_runq(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None,
                                      np.ndarray | None]:
        """`steps()`, each step's run-queue delay and the part of it in the step's opening wait (None where the
        rank's steps never recorded one)."""
        number, start, dur = self.step.view(), self.start.view(), self.dur.view()
        order = np.lexsort((start, number))
        number, start, dur = number[order], start[order], dur[order]
        runq = self.runq.view()[order] if self.runq.n == len(order) and self.runq.n else None
        in_wait = self.in_wait.view()[order] if runq is not None and self.in_wait.n == len(order) else None
        wait = np.zeros(len(number), np.int64)
        if self.wait.n and len(number):
            ws, wd = self.wait_step.view(), self.wait.view()
            first = np.searchsorted(number, ws)  # a step number's first occurrence takes its waits
            ok = (first < len(number)) & (number[np.minimum(first, len(number) - 1)] == ws)
            np.add.at(wait, first[ok], wd[ok])
        return number, start, dur, np.minimum(wait, dur), runq, in_wait


class InputBound(Rule):
    """Per node and rank (TRAIN steps; all steps when a rank has none): the share of step time spent waiting
    for data, over the whole run and over every window of `window` consecutive steps after the first
    `patience`. A rank fires when a window's share exceeds `threshold` %; a rank with fewer steps than a window
    (but at least MIN_SHORT_RUN_STEPS after patience) is one window.

    Evaluation points: each window position of each rank. RuleTriggered = ranks that fire; Violations = window
    positions above the threshold; Datapoints = steps evaluated. Everything is decided from all the steps seen
    so far, in step order, so one chunk or many give the same result."""

    name = "InputBound"
    # is a core left for another worker? are the workers busy? did other processes keep them from a CPU?
    metrics = (CPU_UTIL, WORKERS_ALIVE, WORKERS_BUSY, WORKERS_CPU_UTIL, WORKERS_RUNQ_MS_PER_S)
    description = ("Measures how much of each training step the loop spends waiting for the next batch of data, per "
                   "rank and over sliding windows of steps. A loop that waits for data leaves the accelerator (or "
                   "the CPU doing the training) idle: it is input-bound, whatever the hardware.")
    recommendation = ("Make the input pipeline keep up with training: load batches in worker processes and "
                      "prefetch them, and make each batch cheaper to produce.")
    defaults = {"threshold": 20, "window": 100, "patience": 10}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window", "patience")
        t = self.params["threshold"]
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or not 0 <= t <= 100:
            raise ParameterError(f"{self.name}.threshold={t!r}: must be a percentage from 0 to 100")
        self._ranks: dict[tuple[str, int, str], _Rank] = {}
        self._loaders: dict[tuple[str, int], list[float]] = {}
        self._keras: dict[tuple[str, int], dict[str, Any]] = {}  # a Keras job's input facts (training's first)
        self._loader_info: dict[tuple[str, int, int], dict[str, Any]] = {}  # (node, rank, key) -> first settings
        self._loader_waits: dict[tuple[str, int, str], dict[int, list[int]]] = {}  # per mode: loader -> [µs, n]
        self._cpu: dict[str, tuple[_SpanMedian, ...]] = {}  # node -> its CPU %, workers busy, the workers' CPU %
        self._kept: dict[str, _SpanMedian] = {}  # node -> a worker's wait for a CPU others held, ms per s
        self._loop: dict[str, list[int]] = {}  # node -> [first step start, last step end]
        self._info: dict[str, dict[str, Any]] = {}
        self._ranks_per_node: dict[str, set[int]] = {}
        self._judged: dict[tuple[str, int, str], dict[str, Any]] = {}  # entries of ranks whose node is complete
        self._events = 0
        self._unmeasured: set[tuple[str, int]] = set()  # ranks whose data wait is not recorded (Keras on TF)
        # Batch feeds (`Chunk.replay`): past step_stream.NODE_BYTES of a node's steps held, its largest ranks are
        # streamed (a count and duration buckets) and the node read again once complete (input_stream)
        self._replay: Replay | None = None
        self._streamed: dict[tuple[str, int, str], Any] = {}  # input_stream.StreamedRank, by rank and phase
        self._spans: dict[str, dict[str, dict[int, list[int]]]] = {}  # node -> phase -> span -> [first, last start]
        self._rates: dict[str, list[int]] = {}  # node -> [events, first start, last start]

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        self._replay = chunk.replay or self._replay
        self._add(chunk)
        for node in chunk.done:
            self._close(node)

    def merge(self, other: Rule, node: str) -> None:
        """Fold in `other`, fed only `node`'s chunks: its entries for `node`'s ranks (judged at its `done`: nothing
        in them depends on another node), what the causes of later entries read of `node`, and the run-wide counts."""
        assert isinstance(other, InputBound)
        self._events += other._events
        self._unmeasured |= {key for key in other._unmeasured if key[0] == node}
        if node in other._info:
            self._info[node] = other._info[node]
        if node in other._ranks_per_node:
            self._ranks_per_node.setdefault(node, set()).update(other._ranks_per_node[node])
        for key, workers in other._loaders.items():
            if key[0] == node:
                self._loaders.setdefault(key, []).extend(workers)
        for key, info in other._loader_info.items():
            if key[0] == node:
                self._loader_info.setdefault(key, info)
        ld.merge_waits(self._loader_waits, other._loader_waits, node)
        if node in other._cpu:
            if node in self._cpu:
                for mine, theirs in zip(self._cpu[node], other._cpu[node]):
                    mine.merge(theirs)
            else:
                self._cpu[node] = other._cpu[node]
        if node in other._kept:
            self._kept.setdefault(node, _SpanMedian()).merge(other._kept[node])
        if node in other._loop:
            lo, hi = other._loop[node]
            span = self._loop.setdefault(node, [lo, hi])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
        for key, facts in other._keras.items():  # the rule of `_add`: a training loop's facts replace another's
            if key[0] == node and (key not in self._keras or
                                   facts.get("loop") == "train" != self._keras[key].get("loop")):
                self._keras[key] = facts
        self._judged.update((key, e) for key, e in other._judged.items() if key[0] == node)  # sorted by `result()`
        # A node the worker was not told is complete (a feed without `done`): its steps as held or streamed there,
        # and where to read it again, for `result()` to judge as the single feed would.
        self._ranks.update((key, r) for key, r in other._ranks.items() if key[0] == node)
        self._streamed.update((key, s) for key, s in other._streamed.items() if key[0] == node)
        if node in other._spans:
            self._spans[node] = other._spans[node]
        if node in other._rates:
            self._rates[node] = other._rates[node]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a worker's rule sent back) without the run it reads again: the caller's rule has its own."""
        state = self.__dict__.copy()
        state["_replay"] = None
        return state

    def _add(self, chunk: Chunk) -> None:
        for node, frame in chunk.system.items():
            if frame.info:
                self._info[node] = frame.info
            if len(frame):
                for series, (device, metric) in zip(self._cpu.setdefault(node, tuple(_SpanMedian() for _ in _CPU)),
                                                    _CPU):
                    values = frame.get(device, metric)
                    ok = ~np.isnan(values) if values is not None else None
                    if ok is not None and ok.any():
                        series.add(frame.timestamps[ok].astype(np.int64), values[ok])
                kept = _kept_per_worker(frame)
                if kept is not None and (ok := ~np.isnan(kept)).any():
                    self._kept.setdefault(node, _SpanMedian()).add(frame.timestamps[ok].astype(np.int64), kept[ok])
        for node, rec in ((chunk.run or {}).get("nodes") or {}).items():
            if isinstance(rec, dict):
                self._info.setdefault(node, rec)
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        table = cols.table
        self._unmeasured |= unmeasured_waits(cols, table)
        replayable = chunk.replay is not None
        if replayable:
            track_spans(cols, cols.kind_is(STEP, DATA_WAIT) & (cols.step >= 0), self._spans, self._rates)
        for (node, _), rows in cols.groups(cols.kind_is(STEP), by_mode=False):
            lo, hi = int(cols.start[rows].min()), int(cols.end[rows].max())
            span = self._loop.setdefault(node, [lo, hi])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
        ld.add_waits(self._loader_waits, cols, cols.kind_is(DATA_WAIT) & (cols.step >= 0))
        for (node, rank, mode), rows in cols.groups(cols.kind_is(STEP) & (cols.step >= 0)):
            self._ranks_per_node.setdefault(node, set()).add(rank)
            dur = np.maximum(cols.end[rows] - cols.start[rows], 0)
            streamed = self._streamed.get((node, rank, mode))
            if streamed is not None:
                streamed.add_steps(contention.own_time(dur, contention.step_runq(cols, rows)))
                continue
            r = self._ranks.setdefault((node, rank, mode), _Rank())
            r.step.extend(cols.step[rows])
            r.start.extend(cols.start[rows])
            r.dur.extend(dur)
            r.runq.extend(contention.step_runq(cols, rows))
            r.in_wait.extend(contention.wait_runq(cols, rows))
        for (node, rank, mode), rows in cols.groups(cols.kind_is(DATA_WAIT) & (cols.step >= 0)):
            streamed = self._streamed.get((node, rank, mode))
            if streamed is not None:
                streamed.add_waits(np.maximum(cols.end[rows] - cols.start[rows], 0))
                continue
            r = self._ranks.setdefault((node, rank, mode), _Rank())
            r.wait_step.extend(cols.step[rows])
            r.wait.extend(np.maximum(cols.end[rows] - cols.start[rows], 0))
        if replayable:
            self._stream_long_nodes()
        loaders = np.flatnonzero(cols.kind_is(DATALOADER))
        if loaders.size:
            for i, text in zip(loaders.tolist(), table["args"].take(loaders).to_pylist()):
                key = (cols.nodes[cols.node[i]], int(cols.rank[i]))
                workers = _workers(text)
                if workers is not None:
                    self._loaders.setdefault(key, []).append(workers)
                loader = ld.settings(text)
                if loader is not None and isinstance(loader.get("key"), int):
                    self._loader_info.setdefault((*key, loader["key"]), loader)
                facts = keras_input(text)
                if facts is not None and (key not in self._keras or
                                          facts.get("loop") == "train" != self._keras[key].get("loop")):
                    self._keras[key] = facts

    def result(self) -> RuleResult:
        if self._events == 0:
            return self.not_applicable("no framework data: the job recorded no steps (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        for node in sorted({key[0] for key in self._streamed}):  # a node never said complete (a feed without `done`)
            self._close(node)
        series = [(k, r) for k, r in self._series() if k[:2] not in self._unmeasured or r.wait.n]
        if not series and not self._judged and self._unmeasured:
            return self.not_applicable("the job's steps do not record their wait for data (Keras on TensorFlow "
                                       "reads its input inside the compiled train step); a detailed profiling "
                                       "window shows it as IteratorGetNext")
        if not series and not self._judged:
            return self.not_applicable("no steps with step numbers in the framework data")
        threshold = float(self.params["threshold"])
        details: dict[str, Any] = {}
        triggered = violations = datapoints = 0
        stake = 0.0
        judged = {**self._judged, **{key: self._judge(key, r) for key, r in series}}
        for key in sorted(judged):
            entry = judged[key]
            datapoints += entry["steps"]
            details[rank_key(*key)] = entry
            if entry["triggered"]:
                triggered += 1
                violations += entry["windows_above"]
                stake = max(stake, entry["time_at_stake_s"])  # ranks wait side by side: the worst one's is the job's
        fired = {k: e for k, e in details.items() if e["triggered"]}
        summary = {"ranks": details, "threshold": threshold, "time_at_stake_s": stake,
                   "nodes": sorted({e["node"] for e in fired.values()}),
                   "ranks_fired": [f"{e['node']}/{e['rank']}" for e in fired.values()]}
        if fired:
            top = max(fired.values(), key=lambda e: e["worst_window"]["share"] if e["worst_window"] else 0.0)
            # an evaluation-only (or unmarked) loop is not training
            who = {TRAIN: "Training", EVAL: "Evaluation"}.get(top["phase"], "The loop")
            summary["title"] = (f"{who} waits for data {top['wait_share']:.0f} % of the time on rank "
                                f"{top['node']}/{top['rank']}" if len(fired) == 1 else
                                f"{who} waits for data up to {top['wait_share']:.0f} % of the time on "
                                f"{len(fired)} ranks")
            summary["steps"] = top.get("stall_steps", [])[:MAX_NAMED]
        return self.make_result(triggered=triggered, violations=violations, datapoints=datapoints, details=summary,
                                recommendation=self._advice(fired) if fired else None)

    def _judge(self, key: tuple[str, int, str], r: _Rank) -> dict[str, Any]:
        """One rank's Details entry (its verdict with it): all `result()` needs of it once its data is complete."""
        number, start, dur, wait, runq, in_wait = r.steps_and_runq()
        return self._entry(key, rank_facts(number, start, dur, wait, window=self.params["window"],
                                           patience=self.params["patience"],
                                           threshold=float(self.params["threshold"]), runq=runq,
                                           in_wait=in_wait, workers=self._workers_delay(key, start, dur)))

    def _workers_delay(self, key: tuple[str, int, str], start: np.ndarray, dur: np.ndarray) -> np.ndarray | None:
        """Per step, its loader's workers' wait for a CPU that other processes held (`contention.workers_delay`)."""
        kept = self._kept.get(key[0])
        if kept is None or not kept.ts.n:
            return None
        kept.within(None)  # orders the snapshots once, where they came out of order
        return contention.workers_delay(start, dur, kept.ts.view(), kept.values.view())

    def _entry(self, key: tuple[str, int, str], f: RankFacts) -> dict[str, Any]:
        """A rank's Details entry from its facts (its steps held in memory, or its node read again)."""
        node, rank, mode = key
        entry: dict[str, Any] = {"node": node, "rank": rank, "phase": mode, "steps": f.n,
                                 "wait_s": float(f.wait_us) / US, "step_s": float(f.step_us) / US,
                                 "wait_share": _pct(f.wait_us, f.step_us)}
        entry["worst_window"] = f.worst
        entry["windows_above"] = f.above
        fires = f.above > 0
        entry["triggered"] = fires
        cause, evidence = self._cause(node, rank, mode, f)
        entry.update(cause=cause if fires else None, **evidence)
        if f.stalled and f.named:
            entry["stall_steps"] = f.named
        # what a fix could recover: the waiting itself (a pipeline that keeps up hides it behind compute);
        # for stalls, the stalls' waiting; where the workers already use the cores, no more than the time their
        # CPU work held the rank's share of the cores (all that cheaper batches could give back)
        stake = float(f.wait_us) / US
        if cause == "stalls":
            stake = evidence.get("stall_wait_s", 0.0)
        elif cause == "cpu_bound" and evidence.get("workers_cpu_cores") is not None and evidence["num_workers"]:
            share = evidence["workers_cpu_cores"] / max(evidence["cores"] / evidence["ranks_on_node"], 1.0)
            stake = min(stake, share * float(f.step_us) / US)
        entry["time_at_stake_s"] = stake if fires else 0.0
        return entry

    def _stream_long_nodes(self) -> None:
        """Where a node's steps held pass NODE_BYTES, its largest ranks are streamed from now on, until half of that
        is held."""
        from stallwatch.analyze.rules import input_stream, step_stream

        for key in step_stream.too_long(self._ranks):
            self._streamed[key] = input_stream.StreamedRank.of(self._ranks.pop(key))

    def _close(self, node: str) -> None:
        """The node's data is complete: judge its ranks now and keep only their entries."""
        streamed = {}
        for key, r in self._series(node):
            if key[:2] in self._unmeasured and not _waits(r):
                continue
            if isinstance(r, _Rank):
                self._judged[key] = self._judge(key, r)
            else:
                streamed[key] = r
        spans = self._spans.pop(node, {})
        events, first, last = self._rates.pop(node, [0, 0, 0])
        if streamed:
            from stallwatch.analyze.rules import input_stream, step_stream

            assert self._replay is not None  # ranks are streamed only where the run can be read again
            piece_us = step_stream.PIECE_EVENTS * (last - first + 1) // max(events, 1)
            facts = input_stream.node_facts(node, streamed, spans, self._replay, self.params,
                                            steps_of=_Rank.steps_and_runq, new_rank=_Rank, piece_us=piece_us,
                                            delay_of=self._workers_delay)
            for key, f in facts.items():
                self._judged[key] = self._entry(key, f)
        for key in [key for key in self._ranks if key[0] == node]:
            del self._ranks[key]
        for key in [key for key in self._streamed if key[0] == node]:
            del self._streamed[key]

    def _series(self, node: str | None = None) -> list[tuple[tuple[str, int, str], Any]]:
        """Each rank's TRAIN steps, or all its modes' when it has no TRAIN step (of `node` alone when given): held
        (`_Rank`) or streamed."""
        ranks = {k: s for k, s in {**self._ranks, **self._streamed}.items() if node is None or k[0] == node}
        with_train = {(n, r) for (n, r, m), s in ranks.items() if m == TRAIN and _steps(s)}
        keep = [(k, s) for k, s in ranks.items() if _steps(s) and (k[2] == TRAIN or k[:2] not in with_train)]
        return sorted(keep, key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))

    def _cause(self, node: str, rank: int, mode: str, f: RankFacts) -> tuple[str, dict[str, Any]]:
        """Why this rank's loop (in `mode`) waits: a few long stalls (`f.stalled`); batches so cheap that a worker's
        hand-over would cost more (`cheap_fetch`); workers and training already using the node's cores
        (`cpu_bound`: more workers cannot help); loading in the main process; fewer workers than its share of the
        cores; a slow per-batch fetch despite enough workers. Judged on the loader this loop waited for most."""
        evidence: dict[str, Any] = {}
        loader, loaders = self._loader_of(node, rank, mode)
        if loader is not None:
            num_workers = _number(loader.get("num_workers"))
        else:  # an older run (its waits do not name their loader): the rank's loaders, the most workers of them
            workers = self._loaders.get((node, rank))
            num_workers = float(max(workers)) if workers else None
        cores = _cores(self._info.get(node) or {})
        ranks = max(len(self._ranks_per_node.get(node, ())), 1)
        free = ld.suggested_workers(cores, ranks)  # the rank's share of the cores
        evidence.update(num_workers=num_workers, cores=cores, ranks_on_node=ranks, free_cores_per_rank=free)
        if loader is not None:
            evidence.update(loader=loader, loaders=loaders)
        node_pct, busy, workers_pct = self._job_cpu(node)
        if cores and node_pct is not None:
            evidence.update(idle_cores=cores * (1 - node_pct / 100.0), workers_busy=busy,
                            workers_cpu_cores=None if workers_pct is None else workers_pct * cores / 100.0)
        if f.stalls is not None:
            evidence.update(f.stalls)
            if f.stalled:
                return "stalls", evidence
        keras = self._keras.get((node, rank))
        if keras is not None:
            evidence.update(input=keras.get("input"), worker_threads=keras.get("worker_threads"))
            if keras.get("worker_threads"):  # threads of the training process, under one interpreter lock
                return "threads", evidence
        if keras is None and num_workers == 0 and f.stalls is not None \
                and f.stalls["median_wait_ms"] < ld.CHEAP_FETCH_MS:
            return "cheap_fetch", evidence
        # The workers compute all the time (busy: each used a tenth of a core or more) and no core of the node is
        # idle: another worker would take CPU from these (or from training). Whoever else keeps the node busy, more
        # workers cannot help; on one core per rank, neither can the first.
        saturated = (cores is not None and node_pct is not None and busy is not None and bool(num_workers)
                     and cores * (1 - node_pct / 100.0) < ld.MIN_FREE_CORES
                     and busy >= ld.BUSY_SHARE * min(num_workers, cores))
        if keras is None and num_workers is not None and (saturated or (num_workers == 0 and cores is not None
                                                                        and cores // ranks <= 1)):
            return "cpu_bound", evidence
        if num_workers is not None and num_workers == 0:
            return "main_process", evidence
        if num_workers is not None and free is not None and num_workers < free:
            return "too_few_workers", evidence
        return "slow_fetch", evidence

    def _loader_of(self, node: str, rank: int, mode: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The loader this rank's loop in `mode` waited for most (its settings), and every loader it waited for
        with its wait; (None, []) where the waits do not name their loader."""
        waits = self._loader_waits.get((node, rank, mode)) or {}
        # loaders built at one place (a new DataLoader each epoch) are one loader to the person who wrote it
        by_site: dict[Any, dict[str, Any]] = {}
        for k in sorted(waits):
            info = self._loader_info.get((node, rank, k))
            if k == ld.UNKNOWN or info is None:
                continue
            us, n = waits[k]
            site = (info.get("created_at"), info.get("num_workers")) if info.get("created_at") else k
            entry = by_site.setdefault(site, {**info, "wait_s": 0.0, "waits": 0, "loaders": 0})
            entry["wait_s"] += us / US
            entry["waits"] += n
            entry["loaders"] += 1
        listed = sorted(by_site.values(), key=lambda e: -e["wait_s"])[:MAX_LOADERS]
        return (listed[0] if listed else None), listed

    def _job_cpu(self, node: str) -> tuple[float | None, ...]:
        """Medians over the loop: the node's CPU (%), the loader workers busy, and their CPU (% of the node)."""
        series = self._cpu.get(node)
        if series is None:
            return (None,) * len(_CPU)
        out = []
        for s in series:
            values = s.within(self._loop.get(node))
            out.append(float(values.percentiles((50,))[0]) if values.n else None)
        return tuple(out)

    def _advice(self, fired: dict[str, dict[str, Any]]) -> str:
        lines = []
        for key, e in list(fired.items())[:10]:
            share = e["worst_window"]["share"] if e["worst_window"] else e["wait_share"]
            head = (f"Rank {e['node']}/{e['rank']} waited for data {e['wait_share']:.0f} % of its step time "
                    f"({e['wait_s']:.1f} s; up to {share:.0f} % over steps {e['worst_window']['first_step']}–"
                    f"{e['worst_window']['last_step']})")
            cause = e["cause"]
            if isinstance(e.get("loader"), dict):  # the loader it waited for, named
                head += f", mostly for {ld.label(e['loader'], e.get('phase'))}"
            if e.get("input") not in (None, "torch_dataloader") and cause != "stalls":
                lines.append(f"{head}: {keras_advice(cause, e)}")
            elif cause == "cheap_fetch":
                lines.append(f"{head}: its batches come from memory in {e['median_wait_ms']:.2f} ms each, in the "
                             "training process (num_workers=0). A worker process would not help: handing a batch over "
                             "from a worker costs more than that. Make each batch one indexing operation instead of a "
                             "list of samples to collate: slice the tensors (x[i:i + batch_size]), or pass a "
                             "BatchSampler as the DataLoader's sampler (batch_size=None) to a dataset whose "
                             "__getitem__ takes the list of indices.")
            elif cause == "cpu_bound":
                idle = e.get("idle_cores")
                cores = f"{e['cores']} core{'s' if e['cores'] != 1 else ''}"
                where = (f"its {_num(e['num_workers'])} data-loader workers compute all the time and {idle:.1f} of the "
                         f"node's {cores} is idle" if idle is not None and e["num_workers"] else
                         f"the node has {cores} for {e['ranks_on_node']} rank{'s' if e['ranks_on_node'] != 1 else ''}")
                lines.append(f"{head}: {where}, so more workers cannot help: they would share the same cores. Make "
                             "each batch cheaper to produce (lighter transforms, decode once and cache the decoded "
                             "samples, pre-process the data set offline), or give each GPU more CPU cores.")
            elif cause == "main_process":
                suggest = e["free_cores_per_rank"] or 2
                lines.append(f"{head}: batches are loaded in the training process itself (num_workers=0). Use "
                             f"worker processes: DataLoader(..., num_workers={suggest}, persistent_workers=True, "
                             f"prefetch_factor=2) so batches are prepared while the model "
                             f"{'trains' if e.get('phase') == TRAIN else 'runs'}.")
            elif cause == "too_few_workers":
                lines.append(f"{head}: {_num(e['num_workers'])} data-loader workers for "
                             f"{e['free_cores_per_rank']} cores per rank. Try num_workers="
                             f"{e['free_cores_per_rank']}.")
            elif cause == "stalls":
                steps = ", ".join(str(n) for n in e.get("stall_steps", [])[:10])
                lines.append(f"{head}: most of it in {e['stalls']} long stalls ({e['stall_wait_s']:.1f} s), at steps "
                             f"{steps}. Look at what happens then: a slow read (network storage, cold cache), a "
                             "worker restarting, garbage collection, checkpointing or logging in the loader.")
            else:
                workers = f"{_num(e['num_workers'])} workers" if e["num_workers"] is not None else "its workers"
                lines.append(f"{head}: {workers} cannot produce batches as fast as training consumes them. Make each "
                             "batch cheaper (decode and augment less per sample, pre-process the data set once, "
                             "faster storage or a faster image decoder) or raise prefetch_factor.")
        return " ".join(lines)


def keras_input(text: str) -> dict[str, Any] | None:
    """The facts of a Keras job's input (its `dataloader` event, written by stallwatch.keras), else None."""
    try:
        args = json.loads(text) if text else {}
    except ValueError:
        return None
    return args if isinstance(args, dict) and args.get("framework") == "keras" else None


def keras_advice(cause: str, e: dict[str, Any]) -> str:
    """What to change in a Keras input pipeline (PyDataset, generator, tf.data, arrays) for this cause."""
    kind, free = e.get("input"), e.get("free_cores_per_rank") or 2
    workers = f"workers={free}, use_multiprocessing=True"
    if cause == "threads":
        return (f"the PyDataset's {_num(e.get('worker_threads'))} worker threads share the interpreter lock with "
                f"training, so Python-heavy batches are made one at a time. Pass {workers} (and max_queue_size) to "
                "the PyDataset's super().__init__ so batches are made in worker processes.")
    if kind == "py_dataset":
        if cause == "main_process":
            return (f"Keras makes each batch of the PyDataset in the training thread (workers=1, "
                    f"use_multiprocessing=False). Pass {workers} to its super().__init__ so batches are made "
                    "ahead, in worker processes, while the model trains.")
        if cause == "too_few_workers":
            return (f"{_num(e['num_workers'])} PyDataset worker processes for {free} free cores per rank: try "
                    f"workers={free}.")
        return (f"the PyDataset's {_num(e['num_workers'])} workers cannot make batches as fast as training uses "
                "them: make __getitem__ cheaper (decode and augment less, pre-process the data once, faster "
                "storage) or raise max_queue_size to smooth uneven batches.")
    if kind == "generator":
        return ("Keras draws each batch from a Python generator in the training thread. Rewrite it as a "
                f"keras.utils.PyDataset with {workers}, or as a tf.data pipeline ending in .prefetch().")
    if kind == "tf_data":
        return ("the tf.data pipeline cannot keep up: parallelize its map (num_parallel_calls=tf.data.AUTOTUNE), "
                ".cache() what does not change between epochs, and end it with .prefetch(tf.data.AUTOTUNE).")
    if kind == "arrays":
        return ("the data is in memory (NumPy arrays) and Keras slices each batch in the training thread: larger "
                "batches, or a tf.data pipeline ending in .prefetch(), hide the slicing behind training.")
    return ("the input cannot keep up with training: make batches in worker processes (a keras.utils.PyDataset "
            f"with {workers}) and prefetch them.")


def _workers(text: str) -> float | None:
    try:
        args = json.loads(text) if text else {}
    except ValueError:
        return None
    value = args.get("num_workers") if isinstance(args, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _cores(info: dict[str, Any]) -> int | None:
    cores = info.get("cpu_cores_logical")
    return int(cores) if isinstance(cores, (int, float)) and not isinstance(cores, bool) and cores > 0 else None


def _steps(r: Any) -> int:
    """Steps of a rank held (`_Rank`) or streamed."""
    return r.step.n if isinstance(r, _Rank) else r.n


def _waits(r: Any) -> int:
    return r.wait.n if isinstance(r, _Rank) else r.waits


def _kept_per_worker(frame: Any) -> np.ndarray | None:
    """Per snapshot, one loader worker's wait for a CPU that other processes held (ms per s): the job's workers'
    run-queue delay, the share of it other processes caused (`contention.others_share`), over the workers alive."""
    runq = frame.get(PROC, WORKERS_RUNQ_MS_PER_S)
    if runq is None:
        return None
    node_cpu, job_cpu, alive = frame.get(CPU, CPU_UTIL), frame.get(PROC, CPU_UTIL), frame.get(PROC, WORKERS_ALIVE)
    if node_cpu is None or job_cpu is None:
        return np.zeros(len(runq))
    workers = np.maximum(np.nan_to_num(alive, nan=1.0), 1.0) if alive is not None else 1.0
    return runq * contention.others_share(node_cpu, job_cpu) / workers


def _pct(part: float, whole: float) -> float:
    return 100.0 * float(part) / float(whole) if whole else 0.0


def _num(x: float | None) -> str:
    return "-" if x is None else str(int(x)) if float(x).is_integer() else f"{x:g}"


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """The ranks that waited for data, their waits over all steps the time at stake."""
    if not r.fired:
        return []
    d = InputBoundDetails.from_json(r.details)
    fired = [e for e in d.ranks.values() if isinstance(e, dict) and e.get("triggered")]
    windows = [(int(e["worst_window"]["start_us"]), int(e["worst_window"]["end_us"])) for e in fired
               if isinstance(e.get("worst_window"), dict)]
    evidence = {f"{e['node']}/{e['rank']}": {"wait_share": e.get("wait_share"), "wait_s": e.get("wait_s"),
                                             "cause": e.get("cause"), "num_workers": e.get("num_workers")}
                for e in fired[:16]}
    return [finding(r, s, "data", d.title or "Training waits for data", over_all_steps(d.time_at_stake_s, s),
                    Where(d.nodes, d.ranks_fired, d.steps[:LISTED_STEPS], sorted(windows)[:LISTED_WINDOWS]),
                    evidence)]
