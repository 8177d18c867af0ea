"""CPUBottleneck and IOBottleneck (RULES.md): GPUs idle while the CPU is busy, or waiting on I/O.

One implementation, two rules. A snapshot of a node (after its first `patience`) is a *bottleneck*
when some GPU of the node is below `gpu_threshold` % utilization and some CPU core is above
`cpu_threshold` % utilization (CPUBottleneck) or above `io_threshold` % I/O wait (IOBottleneck). The
per-core columns (`cpuN/…`) are used; a node that records only the total (`cpu/…`) is judged on it.

Evaluation points: every snapshot after patience of a node with GPUs. At each, the rule fires when
the node's bottleneck snapshots so far exceed `threshold` % of its evaluated snapshots so far
(cumulative, per node, in the node's snapshot order — so it depends on the data alone, not on how it
was chunked). RuleTriggered counts those snapshots, summed over nodes. Violations: the bottleneck
snapshots. Datapoints: the evaluated snapshots.

Details: `low_gpu_utilization` (evaluated snapshots with some GPU below `gpu_threshold`),
`bottlenecks` {count, percent, ranges: the first 100 runs of consecutive bottleneck snapshots as
{node, start_us, end_us (timestamp of the run's last snapshot), snapshots}, ranges_total}, `nodes`
{node: per-node breakdown, `above_threshold` = the node's share at the end exceeds `threshold`},
`not_applicable` {node: reason} for nodes without GPU data (skipped), and `framework_context`: what the
training loop was doing during every bottleneck period (see `_Context`).

Framework context: each bottleneck snapshot stands for one sampling interval; an event's share is its
overlap with those periods. An event is matched once the node's snapshots have reached its end (so every
snapshot it overlaps is known), or at the final chunk — the same matches however the data is chunked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from stallwatch.analyze.finding import LISTED_WINDOWS, Finding, Where, finding, pct
from stallwatch.analyze.framework_frame import framework_columns
from stallwatch.analyze.rules.base import Chunk, NodeFrame, Rule, RuleResult
from stallwatch.analyze.rules.kit.appendable import Appendable
from stallwatch.analyze.rules.kit.checks import check_counts, listing, skip_patience
from stallwatch.analyze.rules.kit.details import DetailsRecord
from stallwatch.analyze.rules.kit.windows import all_not_applicable, note_skipped
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import COLUMN_SEP, CPU, CPU_IOWAIT, CPU_UTIL, GPU_UTIL, STEP

MAX_RANGES = 100  # time ranges kept in Details (counted beyond that, not listed)
STEP_CODE = 0  # the code of the kind "step" in the rule's name table


@dataclass(frozen=True)
class BottleneckRange(DetailsRecord):
    """A period of consecutive bottleneck snapshots on one node: its first and last snapshot (µs since the epoch)."""

    node: str = ""
    start_us: int = 0
    end_us: int = 0
    snapshots: int = 0


@dataclass(frozen=True)
class Bottlenecks(DetailsRecord):
    """Details["bottlenecks"]: how many snapshots were bottlenecks, their % of those analyzed, and the periods
    (the first listed, and how many in all)."""

    count: int = 0
    percent: float = 0.0
    ranges: list[BottleneckRange] = field(default_factory=list)
    ranges_total: int | None = None


@dataclass(frozen=True)
class BottleneckNode(DetailsRecord):
    """One node: snapshots analyzed, those with a GPU below gpu_threshold, bottlenecks (count, seconds by the
    snapshots' own intervals, % of snapshots), whether that is above the threshold, and its periods."""

    datapoints: int | None = None
    low_gpu_utilization: int | None = None
    bottlenecks: int = 0
    bottleneck_s: float | None = None
    percent: float | None = None
    above_threshold: bool = False
    ranges: int | None = None


@dataclass(frozen=True)
class LoopDuring(DetailsRecord):
    """One node's training loop inside its bottleneck periods: their seconds, its ranks and events, seconds per
    phase of the steps and per event kind (rank-seconds), and outside steps."""

    bottleneck_s: float = 0.0
    ranks: int = 0
    events: int = 0
    phases_s: dict[str, float] = field(default_factory=dict)
    kinds_s: dict[str, float] = field(default_factory=dict)
    outside_steps_s: float = 0.0


@dataclass(frozen=True)
class BottleneckDetails(DetailsRecord):
    """CPUBottleneck's and IOBottleneck's Details: snapshots with a GPU below gpu_threshold, the bottlenecks, per
    node, and per node what the training loop did during them."""

    rule = "CPUBottleneck"  # and IOBottleneck: one shape
    low_gpu_utilization: int = 0
    bottlenecks: Bottlenecks = field(default_factory=Bottlenecks)
    nodes: dict[str, BottleneckNode] = field(default_factory=dict)
    framework_context: dict[str, LoopDuring] = field(default_factory=dict)


@dataclass
class _Node:
    seen: int = 0  # snapshots received, patience included
    has_gpu: bool = False
    gpus: int = 0
    cores: int = 0
    evaluated: int = 0
    low_gpu: int = 0
    bottlenecks: int = 0
    bottleneck_us: int = 0  # the bottleneck snapshots' sampling intervals, summed (intervals may change live)
    triggered: int = 0
    in_run: bool = False  # the last evaluated snapshot was a bottleneck (its run may go on)
    runs: int = 0  # runs of consecutive bottleneck snapshots, all of them
    ranges: list[list[int]] = field(default_factory=list)  # the first MAX_RANGES: [start_us, end_us, snapshots]
    context: _Context = field(default_factory=lambda: _Context())


class _Context:
    """What the training loop did during a node's bottleneck periods: the periods as sorted, disjoint
    [start, end) intervals (every one, not only the listed ranges), the events not yet matched, and the µs of
    overlap summed per event kind and per step phase (over ranks)."""

    def __init__(self) -> None:
        self.starts, self.ends = Appendable(), Appendable()
        self.last_ts: int | None = None  # the node's latest snapshot so far
        self.waiting: list[tuple[np.ndarray, ...]] = []  # (kind codes, mode codes, starts, ends, ranks)
        self.kinds: dict[int, int] = {}  # kind code -> µs of overlap
        self.phases: dict[int, int] = {}  # mode code -> µs of steps' overlap
        self.ranks: set[int] = set()
        self.events = 0

    def add_periods(self, bad: np.ndarray, ts: np.ndarray, widths_us: np.ndarray) -> None:
        """Bottleneck snapshots (`bad` per snapshot at `ts`) as periods of the sampling interval in force at
        each (`widths_us`)."""
        if ts.size:
            self.last_ts = int(ts[-1])
        if not bad.any():
            return
        lo, hi = ts[bad], ts[bad] + widths_us[bad]
        if self.ends.n and lo[0] <= self.ends.view()[-1]:  # continues (or touches) the last period
            self.ends.view()[-1] = max(int(self.ends.view()[-1]), int(hi[0]))
            lo, hi = lo[1:], hi[1:]
        if lo.size:
            gap = lo[1:] > hi[:-1]  # merge touching snapshots into one period
            first = np.flatnonzero(np.r_[True, gap])
            last = np.r_[first[1:] - 1, lo.size - 1]
            self.starts.extend(lo[first])
            self.ends.extend(np.maximum.reduceat(hi, first) if first.size else hi[last])

    def add_events(self, kinds: np.ndarray, modes: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   ranks: np.ndarray, final: bool) -> None:
        """Events (kind and mode as codes of `Names`); matched once the snapshots have reached their end."""
        if starts.size:
            self.waiting.append((kinds, modes, starts, ends, ranks))
        if not self.waiting:
            return
        if len(self.waiting) == 1:
            kinds, modes, starts, ends, ranks = self.waiting[0]
        else:
            kinds, modes, starts, ends, ranks = (np.concatenate(parts) for parts in zip(*self.waiting))
        ready = np.ones(starts.size, bool) if final else ends <= (self.last_ts if self.last_ts is not None else -1)
        self.waiting = [] if ready.all() else [tuple(a[~ready] for a in (kinds, modes, starts, ends, ranks))]
        if not ready.any():
            return
        kinds, modes, starts, ends, ranks = (a[ready] for a in (kinds, modes, starts, ends, ranks))
        self.events += int(starts.size)
        self.ranks.update((np.flatnonzero(np.bincount(np.maximum(ranks, -1) + 1)) - 1).tolist())
        if not self.starts.n:
            return
        # only events that some period overlaps: one that ends after a period's start it starts before the end of
        p_starts, p_ends = self.starts.view(), self.ends.view()
        near = np.searchsorted(p_starts, ends, side="left") > np.searchsorted(p_ends, starts, side="right")
        if not near.any():
            return
        kinds, modes, starts, ends = kinds[near], modes[near], starts[near], ends[near]
        overlap = self._covered(ends) - self._covered(starts)
        hit = overlap > 0
        if not hit.any():
            return
        for code, us in enumerate(np.bincount(kinds[hit], weights=overlap[hit]).tolist()):
            if us:
                self.kinds[code] = self.kinds.get(code, 0) + int(us)
        steps = hit & (kinds == STEP_CODE)
        if steps.any():
            for code, us in enumerate(np.bincount(modes[steps], weights=overlap[steps]).tolist()):
                if us:
                    self.phases[code] = self.phases.get(code, 0) + int(us)

    def recode(self, codes: np.ndarray) -> None:
        """Renumber kind and mode codes (old code `c` becomes `codes[c]`): a worker's rule numbered them in its
        own table, the merging rule's differs."""
        self.kinds = {int(codes[k]): us for k, us in self.kinds.items()}
        self.phases = {int(codes[m]): us for m, us in self.phases.items()}
        self.waiting = [(codes[k], codes[m], s, e, r) for k, m, s, e, r in self.waiting]

    def _covered(self, t: np.ndarray) -> np.ndarray:
        """µs of bottleneck periods before each time in `t`."""
        starts, ends = self.starts.view(), self.ends.view()
        if starts.size == 0:
            return np.zeros(t.size, np.int64)
        cum = np.concatenate([[0], np.cumsum(ends - starts)])
        i = np.searchsorted(starts, t, side="right")  # periods starting at or before t
        inside = np.where(i > 0, np.minimum(t - starts[np.maximum(i - 1, 0)], (ends - starts)[np.maximum(i - 1, 0)]), 0)
        return cum[np.maximum(i - 1, 0)] * (i > 0) + np.maximum(inside, 0)

    def summary(self, names: list[str]) -> dict[str, Any]:
        """Seconds of the bottleneck periods, and of overlap per step phase and per event kind (summed over
        the node's ranks); `outside_steps_s`: rank-time in the periods spent in no step."""
        period_us = int((self.ends.view() - self.starts.view()).sum())
        in_steps = sum(self.phases.values())
        kinds = sorted(((names[k], v) for k, v in self.kinds.items()), key=lambda kv: (-kv[1], kv[0]))
        return {"bottleneck_s": period_us / 1e6, "ranks": len(self.ranks), "events": self.events,
                "phases_s": {k: v / 1e6 for k, v in sorted((names[k], v) for k, v in self.phases.items())},
                "outside_steps_s": max(period_us * len(self.ranks) - in_steps, 0) / 1e6 if self.ranks else None,
                "kinds_s": {k: v / 1e6 for k, v in kinds}}


class _Bottleneck(Rule):
    """Shared implementation; subclasses name the per-core metric and its threshold parameter."""

    metric: ClassVar[str] = CPU_UTIL
    metrics: ClassVar[tuple[str, ...] | None] = (CPU_UTIL, CPU_IOWAIT, GPU_UTIL)
    busy_param: ClassVar[str] = "cpu_threshold"
    what: ClassVar[str] = "CPU"  # for texts
    busy_text: ClassVar[str] = "a CPU core was above {t} % utilization"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "patience")
        self._nodes: dict[str, _Node] = {}
        self._names: list[str] = [STEP]  # kind and mode names by code (_code)
        self._codes: dict[str, int] = {STEP: STEP_CODE}

    # -- per snapshot ---------------------------------------------------------------------------------

    def _flags(self, frame: NodeFrame, skip: int, st: _Node) -> tuple[np.ndarray, np.ndarray]:
        """(low GPU, bottleneck) per snapshot after `skip`, column by column (no snapshot × device copy)."""
        m = len(frame) - skip
        low = np.zeros(m, bool)
        gpus = frame.devices("gpu", GPU_UTIL)
        for g in gpus:
            low |= frame.columns[f"{g}{COLUMN_SEP}{GPU_UTIL}"][skip:] < self.params["gpu_threshold"]
        cols = [f"{c}{COLUMN_SEP}{self.metric}" for c in frame.devices(CPU, self.metric)]
        if not cols and f"{CPU}{COLUMN_SEP}{self.metric}" in frame.columns:
            cols = [f"{CPU}{COLUMN_SEP}{self.metric}"]
        busy = np.zeros(m, bool)
        limit = self.params[self.busy_param]
        for c in cols:
            busy |= frame.columns[c][skip:] > limit
        st.gpus = max(st.gpus, len(gpus))
        st.cores = max(st.cores, len(cols))
        return low, low & busy

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        threshold = self.params["threshold"]
        for node, frame in chunk.system.items():
            st = self._nodes.setdefault(node, _Node())
            n = len(frame)
            skip = skip_patience(st.seen, n, self.params["patience"])
            st.seen += n
            if n and frame.devices("gpu", GPU_UTIL):
                st.has_gpu = True
            m = n - skip
            if m == 0:
                continue
            with np.errstate(invalid="ignore"):
                low, bad = self._flags(frame, skip, st)
            # cumulative condition at every evaluated snapshot: bottlenecks so far > threshold % of so far
            so_far = st.bottlenecks + np.cumsum(bad, dtype=np.int64)
            count = st.evaluated + np.arange(1, m + 1, dtype=np.int64)
            st.triggered += int(np.count_nonzero(so_far * 100.0 > threshold * count))
            st.evaluated += m
            st.low_gpu += int(np.count_nonzero(low))
            st.bottlenecks = int(so_far[-1])
            self._runs(st, bad, frame.timestamps[skip:])
            widths = (frame.intervals_ms(frame.timestamps[skip:]) * 1000).astype(np.int64)
            st.bottleneck_us += int(widths[bad].sum())
            st.context.add_periods(bad, frame.timestamps[skip:], widths)
        self._match_events(chunk)

    def _match_events(self, chunk: Chunk) -> None:
        """Hand each node's new events to its context (matched there once the snapshots reach them). Nodes
        whose snapshots have no GPU are never evaluated: their events are not kept."""
        table = chunk.framework
        if table is not None and table.num_rows:
            cols = framework_columns(chunk)
            kind_code = np.array([self._code(k) for k in cols.kinds], np.int64)
            mode_code = np.array([self._code(m) for m in cols.modes] or [0], np.int64)
            for code, node in enumerate(cols.nodes):
                st = self._nodes.setdefault(node, _Node())
                if st.context.last_ts is not None and not st.has_gpu:
                    continue
                rows = np.flatnonzero(cols.node == code)
                if rows.size:
                    st.context.add_events(kind_code[cols.kind[rows]], mode_code[cols.mode[rows]], cols.start[rows],
                                          cols.end[rows], cols.rank[rows], chunk.final)
        # A node's events wait for its snapshots to pass them (all of them, while patience lasts): once its data
        # is complete (`done`, batch) or the run has ended, they are matched with every period there will be.
        empty = np.empty(0, np.int64)
        for node, st in self._nodes.items():
            if chunk.final or node in chunk.done:
                st.context.add_events(empty, empty, empty, empty, empty, final=True)

    def _code(self, name: str) -> int:
        """A small number per kind or mode name, the same for the whole evaluation (STEP is 0)."""
        if name not in self._codes:
            self._codes[name] = len(self._names)
            self._names.append(name)
        return self._codes[name]

    @staticmethod
    def _runs(st: _Node, bad: np.ndarray, ts: np.ndarray) -> None:
        """Merge consecutive bottleneck snapshots into ranges, continuing a run across chunks."""
        edges = np.diff(np.concatenate([[st.in_run], bad, [False]]).astype(np.int8))
        starts = np.flatnonzero(edges == 1)
        ends = np.flatnonzero(edges == -1) - 1  # inclusive; the last may be the chunk's end (run goes on)
        if st.in_run:  # the first end closes the run left open by the previous chunk
            if bad[0] and st.runs <= MAX_RANGES:  # ... which went on into this one
                r = st.ranges[st.runs - 1]
                r[1] = int(ts[ends[0]])
                r[2] += int(ends[0] + 1)
            ends = ends[1:]
        for s, e in zip(starts, ends):
            st.runs += 1
            if len(st.ranges) < MAX_RANGES:
                st.ranges.append([int(ts[s]), int(ts[e]), int(e - s + 1)])
        if bad.size:
            st.in_run = bool(bad[-1])

    def merge(self, other: Rule, node: str) -> None:
        """Take `node`'s state from `other` (all state is per node, and this rule has seen no row of `node`), its
        codes renumbered as this rule numbers the names `other` met, in the order it met them (the feed's)."""
        assert isinstance(other, _Bottleneck) and type(other) is type(self)
        codes = np.array([self._code(name) for name in other._names], np.int64)
        for name, st in other._nodes.items():
            if name == node:
                st.context.recode(codes)
                self._nodes[name] = st
            else:  # seen there with no rows (or only named by an event table): as fresh as the feed would make it
                self._nodes.setdefault(name, _Node())

    # -- result ---------------------------------------------------------------------------------------

    def result(self) -> RuleResult:
        nodes = {n: s for n, s in self._nodes.items() if s.has_gpu}
        if not nodes:
            return all_not_applicable(self, self._nodes)
        threshold = self.params["threshold"]
        per_node: dict[str, Any] = {}
        ranges: list[dict[str, Any]] = []
        findings: list[str] = []
        total = low = bad = triggered = runs = 0
        for node in sorted(nodes):
            st = nodes[node]
            total += st.evaluated
            low += st.low_gpu
            bad += st.bottlenecks
            triggered += st.triggered
            runs += st.runs
            pct = 100.0 * st.bottlenecks / st.evaluated if st.evaluated else 0.0
            above = st.evaluated > 0 and st.bottlenecks * 100.0 > threshold * st.evaluated
            per_node[node] = {"datapoints": st.evaluated, "low_gpu_utilization": st.low_gpu,
                              "bottlenecks": st.bottlenecks, "bottleneck_s": round(st.bottleneck_us / 1e6, 3),
                              "percent": round(pct, 2), "above_threshold": above,
                              "triggered": st.triggered, "ranges": st.runs, "gpus": st.gpus, "cores": st.cores}
            ranges += [{"node": node, "start_us": s, "end_us": e, "snapshots": k} for s, e, k in st.ranges]
            if st.bottlenecks:
                findings.append(self._finding(node, st, pct, above))
        ranges.sort(key=lambda r: (r["start_us"], r["node"]))
        details: dict[str, Any] = {
            "low_gpu_utilization": low,
            "bottlenecks": {"count": bad, "percent": round(100.0 * bad / total, 2) if total else 0.0,
                            "ranges": ranges[:MAX_RANGES], "ranges_total": runs},
            "nodes": per_node,
            "framework_context": {node: nodes[node].context.summary(self._names) for node in sorted(nodes)
                                  if nodes[node].context.events},
        }
        message = note_skipped(details, self._nodes)
        recommendation = f"{listing(findings)}. {self.recommendation}" if findings else None
        return self.make_result(triggered=triggered, violations=bad, datapoints=total, details=details,
                                message=message, recommendation=recommendation)

    def _finding(self, node: str, st: _Node, pct: float, above: bool) -> str:
        t = self.params["threshold"]
        where = "above" if above else "below"
        busy = self.busy_text.format(t=self.params[self.busy_param])
        return (f"{self.what} bottlenecks on node {node} in {pct:.0f} % of the time ({st.bottlenecks} of "
                f"{st.evaluated} snapshots after the first {self.params['patience']}: a GPU was below "
                f"{self.params['gpu_threshold']} % while {busy}), {where} the threshold of {t} %"
                + self._advice(node, st, above))

    def _advice(self, node: str, st: _Node, above: bool) -> str:
        return ""


class CPUBottleneck(_Bottleneck):
    """GPUs below `gpu_threshold` % while a core is above `cpu_threshold` % utilization; evaluation
    points, counts and Details as the module says."""

    name = "CPUBottleneck"
    description = ("Checks if the CPU utilization is high and the GPU utilization is low. It might indicate CPU "
                   "bottlenecks, where the GPUs are waiting for data to arrive from the CPUs. The rule evaluates "
                   "the CPU and GPU utilization rates, and triggers the issue if the time spent on the CPU "
                   "bottlenecks exceeds a threshold percent of the total training time. The default threshold "
                   "is 50 percent.")
    recommendation = "Consider increasing the number of data loaders or applying data pre-fetching."
    defaults = {"threshold": 50, "cpu_threshold": 90, "gpu_threshold": 10, "patience": 1000}

    metric = CPU_UTIL
    metrics = (CPU_UTIL, GPU_UTIL)
    busy_param = "cpu_threshold"
    what = "CPU"
    busy_text = "a CPU core was above {t} % utilization"

    def _advice(self, node: str, st: _Node, above: bool) -> str:
        if not above or not st.cores or not st.gpus:
            return ""
        return (f"; the node has {st.cores} cores for {st.gpus} GPU(s): move preprocessing off the training "
                f"process into data-loader workers (e.g. num_workers up to {max(1, st.cores // st.gpus - 1)} "
                f"per GPU) and prefetch batches")


class IOBottleneck(_Bottleneck):
    """GPUs below `gpu_threshold` % while a core's I/O wait is above `io_threshold` %; evaluation points,
    counts and Details as the module says."""

    name = "IOBottleneck"
    description = ("Checks if the data I/O wait time is high and the GPU utilization is low. It might indicate IO "
                   "bottlenecks where GPU is waiting for data to arrive from storage. The rule evaluates the I/O "
                   "and GPU utilization rates and triggers the issue if the time spent on the IO bottlenecks "
                   "exceeds a threshold percent of the total training time. The default threshold is 50 percent.")
    recommendation = ("Pre-fetch data or choose different file formats, such as binary formats that improve I/O "
                      "performance.")
    defaults = {"threshold": 50, "io_threshold": 50, "gpu_threshold": 10, "patience": 1000}

    metric = CPU_IOWAIT
    metrics = (CPU_IOWAIT, GPU_UTIL)
    busy_param = "io_threshold"
    what = "I/O"
    busy_text = "a CPU core waited on I/O more than {t} % of its time"

    def _advice(self, node: str, st: _Node, above: bool) -> str:
        if not above:
            return ""
        return ("; read the data set from local disk or in larger sequential files (sharded binary records), "
                "and load it with several workers in parallel")


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    """One finding per node whose share of bottleneck snapshots passed the threshold; its time at stake is the
    bottleneck snapshots' own intervals."""
    what = "CPU" if r.name == "CPUBottleneck" else "I/O"
    d = BottleneckDetails.from_json(r.details)
    out = []
    for node, e in sorted(d.nodes.items()):
        if not e.above_threshold:
            continue
        held = e.bottleneck_s  # the snapshots' own intervals; a result of an older version has none
        stake = (float(held) if held is not None else e.bottlenecks * s.sample_interval_ms.get(node, 0.0) / 1000.0) \
            or None
        windows = [(x.start_us, x.end_us) for x in d.bottlenecks.ranges if x.node == node]
        out.append(finding(r, s, node,
                           f"GPUs idle while the {what} was the bottleneck {pct(e.percent)} of the time "
                           f"on node {node}", stake, Where([node], windows=windows[:LISTED_WINDOWS]),
                           {"bottleneck_snapshots": e.bottlenecks, "snapshots": e.datapoints,
                            "percent": e.percent, "threshold_percent": r.parameters.get("threshold")}))
    return out
