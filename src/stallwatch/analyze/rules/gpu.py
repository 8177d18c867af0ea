"""The GPU rules: LowGPUUtilization, BatchSize, GPUMemoryIncrease and LoadBalancing (RULES.md).

All four skip the first `patience` snapshots of each node. The window rules cut what follows into
consecutive, non-overlapping windows of `window` snapshots, per node, by position in the node's
snapshot sequence — never by when `update()` is called — so one chunk or many give the same windows.
A trailing window shorter than `window` is evaluated once, by the chunk that has `final` set (in batch
the only chunk, live the last one), and only by the rules that allow partial windows (LowGPUUtilization
and BatchSize; GPUMemoryIncrease compares equal-size windows only and drops it).

Whole-run statistics (box plots, p5, max) need every value: the rules keep each reported series as a
`Distribution` (counts per 0.01 % step for stored percentages: a few kB per series however long the run;
exact percentiles at any moment). LoadBalancing keeps only histogram counts.

A node without GPU data is not applicable (listed in Details["not_applicable"]); a run without any GPU
data makes the whole rule not applicable. Details are keyed by node as SageMaker's were
(`Details[node][gpu]`), with SageMaker's top-level `last_timestamp` where it had one."""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from stallwatch.analyze.rules.base import Chunk, NodeFrame, ParameterError, Rule, RuleResult
from stallwatch.analyze.rules.stats import Distribution, Frozen
from stallwatch.records import COLUMN_SEP, CPU, CPU_UTIL, GPU_MEM_UTIL, GPU_UTIL

_TOTAL_CPU = f"{CPU}{COLUMN_SEP}{CPU_UTIL}"
_MAX_LISTED = 5  # findings a recommendation names before "and N more"


# ---------------------------------------------------------------------------------------------------
# shared machinery (also used by the other system rules)


def check_counts(rule: Rule, *names: str) -> None:
    """`patience` must be >= 0, `window` >= 1: a clear error instead of a silent empty result."""
    for key in names:
        value = rule.params[key]
        low = 1 if key == "window" else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ParameterError(f"{rule.name}.{key}={value!r}: must be an integer >= {low}")


def check_non_negative(rule: Rule, *names: str) -> None:
    """Continuous parameters (thresholds, margins) must be finite numbers >= 0."""
    for key in names:
        value = rule.params[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ParameterError(f"{rule.name}.{key}={value!r}: must be a number >= 0")


def skip_patience(seen: int, n: int, patience: int) -> int:
    """How many of `n` new snapshots of a node still fall into its first `patience` (`seen` so far)."""
    return min(n, max(0, patience - seen))


def gpu_series(frame: NodeFrame, metric: str) -> dict[str, np.ndarray]:
    """{"gpu0/metric": values, …} for the node's numbered GPUs, in number order."""
    return {f"{d}{COLUMN_SEP}{metric}": frame.columns[f"{d}{COLUMN_SEP}{metric}"] for d in frame.devices("gpu", metric)}


def device_of(column: str) -> str:
    return column.partition(COLUMN_SEP)[0]


def _device_number(column: str) -> int:
    digits = "".join(ch for ch in device_of(column) if ch.isdigit())
    return int(digits) if digits else -1


def when(us: int | None) -> str:
    """µs since the epoch as readable UTC text (for recommendations)."""
    if us is None:
        return "-"
    return _dt.datetime.fromtimestamp(us / 1e6, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def rounded(stats: dict[str, float], digits: int = 4) -> dict[str, float]:
    """Statistics of float32-kept values, without float32's noise digits."""
    return {k: round(float(v), digits) for k, v in stats.items()}


def plain_float(x: float | None, digits: int = 4) -> float | None:
    """A JSON number (None for NaN)."""
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


@dataclass
class Block:
    """Whole windows of one node ready to evaluate: `n_full` windows of `window` snapshots, then (only
    in the final chunk) one partial window of `partial` snapshots. `cols` maps column -> values."""

    timestamps: np.ndarray
    cols: dict[str, np.ndarray]
    window: int
    n_full: int
    partial: int

    @property
    def n_windows(self) -> int:
        return self.n_full + (1 if self.partial else 0)

    @property
    def size(self) -> int:
        return len(self.timestamps)

    def starts(self) -> np.ndarray:
        """Timestamp of the first snapshot of each window."""
        return self.timestamps[0: self.n_windows * self.window: self.window]

    def ends(self) -> np.ndarray:
        """Timestamp of the last snapshot of each window."""
        ends = self.timestamps[self.window - 1: self.n_full * self.window: self.window]
        if self.partial:
            ends = np.append(ends, self.timestamps[-1])
        return ends

    def percentiles(self, x: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
        """(n_windows, len(qs)) percentiles of each window (NaN ignored; NaN for an all-NaN window)."""
        out = np.full((self.n_windows, len(qs)), np.nan)
        w, nf = self.window, self.n_full
        if nf:
            full = x[: nf * w].reshape(nf, w)
            holes = np.isnan(full).any(axis=1)
            if not holes.any():
                out[:nf] = np.percentile(full, qs, axis=1).T
            else:
                clean = ~holes
                if clean.any():
                    out[:nf][clean] = np.percentile(full[clean], qs, axis=1).T
                for i in np.flatnonzero(holes):  # windows with gaps: few
                    out[i] = _percentiles_1d(full[i], qs)
        if self.partial:
            out[-1] = _percentiles_1d(x[nf * w:], qs)
        return out

    def means(self, x: np.ndarray) -> np.ndarray:
        """Mean of each full window (NaN ignored; NaN for an all-NaN window); partial windows excluded."""
        nf, w = self.n_full, self.window
        full = x[: nf * w].reshape(nf, w)
        ok = ~np.isnan(full)
        counts = ok.sum(axis=1)
        sums = np.where(ok, full, 0.0).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _percentiles_1d(x: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    v = x[~np.isnan(x)]
    if v.size == 0:
        return np.full(len(qs), np.nan)
    return np.percentile(v, qs)


class Windows:
    """One node's snapshots after patience, cut into consecutive windows of `window` snapshots.

    `feed()` takes the node's new snapshots (any number, any chunking) and returns the windows they
    complete; fewer than `window` leftover snapshots wait for the next chunk, unless `flush` (the final
    chunk) asks for them as one partial window. Columns may appear or vanish between chunks: a column
    missing from some snapshots reads NaN there, exactly as in a whole-run frame."""

    def __init__(self, patience: int, window: int) -> None:
        self.patience, self.window = patience, window
        self.seen = 0
        self.ts = np.empty(0, np.int64)
        self.cols: dict[str, np.ndarray] = {}

    def feed(self, timestamps: np.ndarray, cols: dict[str, np.ndarray], *, flush: bool,
             partial_ok: bool = True) -> Block | None:
        n = len(timestamps)
        skip = skip_patience(self.seen, n, self.patience)
        self.seen += n
        ts = timestamps[skip:]
        new = {k: v[skip:] for k, v in cols.items()}
        if len(self.ts):
            old_n, add_n = len(self.ts), len(ts)
            merged = {}
            for k in [*self.cols, *(k for k in new if k not in self.cols)]:
                a = self.cols.get(k)
                b = new.get(k)
                merged[k] = np.concatenate([a if a is not None else np.full(old_n, np.nan),
                                            b if b is not None else np.full(add_n, np.nan)])
            ts = np.concatenate([self.ts, ts])
            new = merged
        total = len(ts)
        n_full = total // self.window
        used = n_full * self.window
        partial = total - used if flush and partial_ok else 0
        rest = used + partial
        if flush:  # nothing more comes: a partial window not evaluated now never is
            self.ts, self.cols = np.empty(0, np.int64), {}
        else:
            self.ts = ts[rest:].copy()
            self.cols = {k: v[rest:].copy() for k, v in new.items()}
        if rest == 0:
            return None
        return Block(ts[:rest], {k: v[:rest] for k, v in new.items()}, self.window, n_full, partial)


def ordered_columns(cols: dict[str, Any]) -> list[str]:
    return sorted(cols, key=lambda c: (_device_number(c), c))


def not_applicable_nodes(nodes: dict[str, Any], what: str) -> dict[str, str]:
    return {node: f"no {what} recorded on node {node}" for node in sorted(nodes) if not nodes[node].has_gpu}


def note_skipped(details: dict[str, Any], nodes: dict[str, Any], what: str = "GPU data") -> str:
    """Nodes without `what` into Details["not_applicable"]; the result's Message saying so ("" when none)."""
    skipped = not_applicable_nodes(nodes, what)
    if not skipped:
        return ""
    details["not_applicable"] = skipped
    return f"skipped nodes without {what}: {', '.join(skipped)}"


def all_not_applicable(rule: Rule, nodes: dict[str, Any], what: str = "GPU data") -> RuleResult:
    if not nodes:
        reason = "no system data: no node reported any snapshot"
    else:
        reason = (f"no {what} on any node ({', '.join(sorted(nodes))}): {rule.name} needs GPUs, "
                  f"this run is CPU-only")
    return rule.not_applicable(reason, {"reason": reason, "not_applicable": not_applicable_nodes(nodes, what)
                                        if nodes else {}})


def take_node(mine: dict[str, Any], theirs: dict[str, Any], node: str, seen: Callable[[Any], int]) -> None:
    """`merge` for a rule whose state is all per node (no run-wide accumulator): `node`'s state from `theirs` (a
    rule fed only that node's chunks, the others as empty frames) replaces `mine`'s, which saw at most empty
    frames of it. Its windows and patience count from the node's first snapshot, so they cannot be joined to
    rows `mine` already had: that is refused, not guessed. `seen(state)`: the node's snapshots so far."""
    if node not in theirs:
        return
    if node in mine and seen(mine[node]):
        raise ValueError(f"node {node} was fed to both rules: its windows cannot be joined")
    mine[node] = theirs[node]  # a key already there keeps its place


MAX_WINDOWS = 100  # flagged windows listed per node in Details (all are counted)


@dataclass
class Flagged:
    """A node's flagged windows in time order: the first MAX_WINDOWS as [start_us, end_us, [devices]] (the
    timestamps of their first and last snapshots), and how many there were."""
    windows: list[list[Any]] = field(default_factory=list)
    total: int = 0

    def add(self, block: Block, flags: dict[str, np.ndarray]) -> None:
        """`flags`: per device, which of the block's windows it flagged."""
        if not flags:
            return
        any_flag = np.logical_or.reduce(list(flags.values()))
        hits = np.flatnonzero(any_flag)
        self.total += int(hits.size)
        room = MAX_WINDOWS - len(self.windows)
        if room <= 0 or hits.size == 0:
            return
        starts, ends = block.starts(), block.ends()
        for k in hits[:room].tolist():
            self.windows.append([int(starts[k]), int(ends[k]), [d for d, f in flags.items() if f[k] and d]])


def flagged_details(nodes: dict[str, Any]) -> dict[str, Any]:
    """Details["flagged_windows"]: every node's listed windows in time order, and the total."""
    windows = [{"node": node, "start_us": a, "end_us": b, "devices": devices}
               for node in sorted(nodes) for a, b, devices in nodes[node].flagged.windows]
    windows.sort(key=lambda w: (w["start_us"], w["node"]))
    return {"windows": windows, "total": sum(nodes[n].flagged.total for n in nodes)}


def listing(items: list[str]) -> str:
    shown = items[:_MAX_LISTED]
    more = f"; and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
    return "; ".join(shown) + more


# ---------------------------------------------------------------------------------------------------
# LowGPUUtilization


@dataclass
class _GpuWindows:
    values: Distribution = field(default_factory=Distribution)
    windows: int = 0  # windows with data for this GPU
    underutilized: int = 0
    fluctuating: int = 0
    last_timestamp: int | None = None
    lowest_p95: float | None = None  # over underutilized windows
    lowest_p5: float | None = None  # over fluctuating windows


def _lowest(current: float | None, values: np.ndarray) -> float | None:
    if values.size == 0:
        return current
    low = float(values.min())
    return low if current is None else min(current, low)


@dataclass
class _LowNode:
    windows: Windows
    has_gpu: bool = False
    snapshots: int = 0
    n_windows: int = 0
    triggered: int = 0
    gpus: dict[str, _GpuWindows] = field(default_factory=dict)
    flagged: Flagged = field(default_factory=Flagged)

    def freeze(self) -> None:
        """The node's data is complete: keep its statistics, not its values."""
        for acc in self.gpus.values():
            acc.values = Frozen(acc.values)  # type: ignore[assignment]


class LowGPUUtilization(Rule):
    """Per node and GPU, per window (`window` snapshots after `patience`): p95 of utilization below
    `threshold_p95` -> underutilized; p95 above `threshold_p95` and p5 below `threshold_p5` ->
    fluctuating.

    Evaluation points: the windows of each node (all its GPUs at once); RuleTriggered counts windows in
    which some GPU was underutilized or fluctuating, Violations the (window, GPU) pairs that were.
    Datapoints: snapshots in evaluated windows. Details[node][gpu]: `gpu_max`, `gpu_95`, `gpu_5` and the
    box-plot stats over all evaluated snapshots, `case` (the more frequent of "underutilized" /
    "fluctuating", None if neither), window counts, the lowest window p95 among underutilized windows and
    the lowest window p5 among fluctuating ones, `last_timestamp` (end of its last flagged window);
    Details["last_timestamp"]: the latest of them."""

    name = "LowGPUUtilization"
    metrics = (GPU_UTIL,)
    description = ("Checks if the GPU utilization is low or fluctuating. This can happen due to bottlenecks, "
                   "blocking calls for synchronizations, or a small batch size.")
    recommendation = ("Check if there are bottlenecks, minimize blocking calls, change distributed training "
                      "strategy, or increase the batch size.")
    defaults = {"threshold_p95": 70, "threshold_p5": 10, "window": 500, "patience": 1000}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window", "patience")
        self._nodes: dict[str, _LowNode] = {}

    def update(self, chunk: Chunk) -> None:
        t95, t5 = self.params["threshold_p95"], self.params["threshold_p5"]
        for node, frame in chunk.system.items():
            st = self._nodes.get(node)
            if st is None:
                st = self._nodes[node] = _LowNode(Windows(self.params["patience"], self.params["window"]))
            cols = gpu_series(frame, GPU_UTIL)
            st.has_gpu |= bool(cols) and len(frame) > 0
            done = node in chunk.done  # nothing more comes for it: its partial window is its last
            block = st.windows.feed(frame.timestamps, cols, flush=chunk.final or done)
            if block is not None:
                self._judge(st, block, t95, t5)
            if done:
                st.freeze()

    def merge(self, other: Rule, node: str) -> None:
        """Every statistic here is per node and the result orders nodes by name: `node`'s state is taken whole."""
        assert isinstance(other, LowGPUUtilization)
        take_node(self._nodes, other._nodes, node, lambda st: st.windows.seen)

    def _judge(self, st: _LowNode, block: Block, t95: float, t5: float) -> None:
        """The windows `block` completes on one node."""
        st.snapshots += block.size
        st.n_windows += block.n_windows
        ends = block.ends()
        flagged = np.zeros(block.n_windows, bool)
        by_gpu: dict[str, np.ndarray] = {}
        for col, x in block.cols.items():
            acc = st.gpus.setdefault(device_of(col), _GpuWindows())
            acc.values.add(x)
            q = block.percentiles(x, (5.0, 95.0))
            p5, p95 = q[:, 0], q[:, 1]
            with np.errstate(invalid="ignore"):
                under = p95 < t95
                fluct = (p95 > t95) & (p5 < t5)
            acc.windows += int(np.count_nonzero(~np.isnan(p95)))
            acc.underutilized += int(under.sum())
            acc.fluctuating += int(fluct.sum())
            acc.lowest_p95 = _lowest(acc.lowest_p95, p95[under])
            acc.lowest_p5 = _lowest(acc.lowest_p5, p5[fluct])
            bad = under | fluct
            if bad.any():
                acc.last_timestamp = int(ends[np.flatnonzero(bad)[-1]])
            flagged |= bad
            by_gpu[device_of(col)] = bad
        st.triggered += int(flagged.sum())
        st.flagged.add(block, by_gpu)

    def result(self) -> RuleResult:
        nodes = {n: s for n, s in self._nodes.items() if s.has_gpu}
        if not nodes:
            return all_not_applicable(self, self._nodes)
        t95, t5 = self.params["threshold_p95"], self.params["threshold_p5"]
        details: dict[str, Any] = {}
        violations = triggered = datapoints = 0
        last: int | None = None
        findings: list[str] = []
        for node in sorted(nodes):
            st = nodes[node]
            datapoints += st.snapshots
            triggered += st.triggered
            per_gpu: dict[str, Any] = {}
            for gpu in ordered_columns(st.gpus):
                acc = st.gpus[gpu]
                v = acc.values
                violations += acc.underutilized + acc.fluctuating
                if acc.last_timestamp is not None:
                    last = acc.last_timestamp if last is None else max(last, acc.last_timestamp)
                case = None
                if acc.underutilized or acc.fluctuating:
                    case = "underutilized" if acc.underutilized >= acc.fluctuating else "fluctuating"
                entry: dict[str, Any] = {"gpu_max": None, "gpu_95": None, "gpu_5": None}
                if v.n:
                    p5, p95 = v.percentiles((5, 95))
                    entry = {"gpu_max": plain_float(v.max()), "gpu_95": plain_float(p95), "gpu_5": plain_float(p5)}
                    entry.update(rounded(v.box_stats()))
                entry.update({"case": case, "windows": acc.windows, "underutilized": acc.underutilized,
                              "fluctuating": acc.fluctuating, "lowest_window_p95": plain_float(acc.lowest_p95),
                              "lowest_window_p5": plain_float(acc.lowest_p5), "last_timestamp": acc.last_timestamp})
                per_gpu[gpu] = entry
                if acc.underutilized:
                    findings.append(f"{gpu} on node {node} was underutilized in {acc.underutilized} of "
                                    f"{acc.windows} windows (p95 of utilization below {t95} %, down to "
                                    f"{acc.lowest_p95:.0f} %)")
                if acc.fluctuating:
                    findings.append(f"{gpu} on node {node} fluctuated in {acc.fluctuating} of {acc.windows} "
                                    f"windows (p95 above {t95} % but p5 below {t5} %, down to {acc.lowest_p5:.0f} %)")
            details[node] = per_gpu
        details["last_timestamp"] = last
        details["flagged_windows"] = flagged_details(nodes)
        message = note_skipped(details, self._nodes)
        recommendation = None
        if findings:
            recommendation = f"{listing(findings)}. {self.recommendation}"
        return self.make_result(triggered=triggered, violations=violations, datapoints=datapoints,
                                details=details, message=message, recommendation=recommendation)


# ---------------------------------------------------------------------------------------------------
# BatchSize


@dataclass
class _BatchNode:
    windows: Windows
    has_gpu: bool = False
    snapshots: int = 0
    n_windows: int = 0
    violations: int = 0
    last_timestamp: int | None = None
    values: dict[str, Distribution] = field(default_factory=dict)  # column -> values
    flagged: Flagged = field(default_factory=Flagged)

    def freeze(self) -> None:
        """The node's data is complete: keep its statistics, not its values."""
        self.values = {col: Frozen(v) for col, v in self.values.items()}  # type: ignore[misc]


class BatchSize(Rule):
    """Per node, per window (`window` snapshots after `patience`): p95 of total CPU utilization below
    `cpu_threshold_p95`, and for some GPU both p95 of its utilization below `gpu_threshold_p95` and p95
    of its memory utilization below `gpu_memory_threshold_p95` -> the batch is too small for the
    instance.

    Evaluation points: the windows of each node; RuleTriggered and Violations both count the flagged
    windows. Datapoints: snapshots in evaluated windows. Details[node]: box-plot stats of `cpu`, each
    `gpuN` and `gpuN_memory` (memory from memory alone) over all evaluated snapshots, plus `windows`,
    `violations` and `last_timestamp` (end of the node's last flagged window); Details["last_timestamp"]:
    the latest over nodes."""

    name = "BatchSize"
    metrics = (CPU_UTIL, GPU_UTIL, GPU_MEM_UTIL)
    description = ("Checks if GPUs are underutilized because the batch size is too small. To detect this "
                   "problem, the rule analyzes the average GPU memory footprint, the CPU and the GPU utilization. ")
    recommendation = ("The batch size is too small, and GPUs are underutilized. Consider running on a smaller "
                      "instance type or increasing the batch size.")
    defaults = {"cpu_threshold_p95": 70, "gpu_threshold_p95": 70, "gpu_memory_threshold_p95": 70,
                "patience": 1000, "window": 500}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window", "patience")
        self._nodes: dict[str, _BatchNode] = {}

    def update(self, chunk: Chunk) -> None:
        p = self.params
        for node, frame in chunk.system.items():
            st = self._nodes.get(node)
            if st is None:
                st = self._nodes[node] = _BatchNode(Windows(p["patience"], p["window"]))
            util = gpu_series(frame, GPU_UTIL)
            cols = {}
            if _TOTAL_CPU in frame.columns:
                cols[_TOTAL_CPU] = frame.columns[_TOTAL_CPU]
            cols.update(util)
            cols.update(gpu_series(frame, GPU_MEM_UTIL))
            st.has_gpu |= bool(util) and len(frame) > 0
            done = node in chunk.done  # nothing more comes for it: its partial window is its last
            block = st.windows.feed(frame.timestamps, cols, flush=chunk.final or done)
            if block is not None:
                self._judge(st, block)
            if done:
                st.freeze()

    def merge(self, other: Rule, node: str) -> None:
        """Every statistic here is per node and the result orders nodes by name: `node`'s state is taken whole."""
        assert isinstance(other, BatchSize)
        take_node(self._nodes, other._nodes, node, lambda st: st.windows.seen)

    def _judge(self, st: _BatchNode, block: Block) -> None:
        """The windows `block` completes on one node."""
        p = self.params
        st.snapshots += block.size
        st.n_windows += block.n_windows
        for col, x in block.cols.items():
            st.values.setdefault(col, Distribution()).add(x)
        nan = np.full(block.size, np.nan)
        cpu95 = block.percentiles(block.cols.get(_TOTAL_CPU, nan), (95.0,))[:, 0]
        some_gpu = np.zeros(block.n_windows, bool)
        for col in block.cols:
            device, _, metric = col.partition(COLUMN_SEP)
            if metric != GPU_UTIL:
                continue
            u95 = block.percentiles(block.cols[col], (95.0,))[:, 0]
            m95 = block.percentiles(block.cols.get(f"{device}{COLUMN_SEP}{GPU_MEM_UTIL}", nan), (95.0,))[:, 0]
            with np.errstate(invalid="ignore"):
                some_gpu |= (u95 < p["gpu_threshold_p95"]) & (m95 < p["gpu_memory_threshold_p95"])
        with np.errstate(invalid="ignore"):
            bad = (cpu95 < p["cpu_threshold_p95"]) & some_gpu
        st.violations += int(bad.sum())
        if bad.any():
            st.last_timestamp = int(block.ends()[np.flatnonzero(bad)[-1]])
        st.flagged.add(block, {"": bad})  # the node as a whole: no device named

    def result(self) -> RuleResult:
        nodes = {n: s for n, s in self._nodes.items() if s.has_gpu}
        if not nodes:
            return all_not_applicable(self, self._nodes)
        details: dict[str, Any] = {}
        violations = datapoints = 0
        last: int | None = None
        findings: list[str] = []
        for node in sorted(nodes):
            st = nodes[node]
            datapoints += st.snapshots
            violations += st.violations
            entry: dict[str, Any] = {}
            if _TOTAL_CPU in st.values:
                entry["cpu"] = rounded(st.values[_TOTAL_CPU].box_stats())
            for col in ordered_columns({c: 0 for c in st.values if c != _TOTAL_CPU}):
                device, _, metric = col.partition(COLUMN_SEP)
                key = device if metric == GPU_UTIL else f"{device}_memory"
                entry[key] = rounded(st.values[col].box_stats())
            # gpuN before gpuN_memory, GPUs in number order
            entry = dict(sorted(entry.items(), key=lambda kv: _batch_key_order(kv[0])))
            entry.update({"windows": st.n_windows, "violations": st.violations, "last_timestamp": st.last_timestamp})
            details[node] = entry
            if st.last_timestamp is not None:
                last = st.last_timestamp if last is None else max(last, st.last_timestamp)
            if st.violations:
                gpus = [k for k in entry if k.startswith("gpu") and not k.endswith("_memory") and entry[k]]
                gpu95 = max((entry[k]["p95"] for k in gpus), default=None)
                mem95 = max((entry[f"{k}_memory"]["p95"] for k in gpus if entry.get(f"{k}_memory")), default=None)
                cpu95 = entry.get("cpu", {}).get("p95")
                findings.append(f"node {node}: {st.violations} of {st.n_windows} windows had low CPU, GPU and "
                                f"GPU memory usage (over the run p95 of CPU {_pct(cpu95)}, of the busiest GPU "
                                f"{_pct(gpu95)}, of GPU memory at most {_pct(mem95)})")
        details["last_timestamp"] = last
        details["flagged_windows"] = flagged_details(nodes)
        message = note_skipped(details, self._nodes)
        recommendation = f"{listing(findings)}. {self.recommendation}" if findings else None
        return self.make_result(triggered=violations, violations=violations, datapoints=datapoints,
                                details=details, message=message, recommendation=recommendation)


def _batch_key_order(key: str) -> tuple[int, int, str]:
    if key == "cpu":
        return (-1, 0, key)
    base = key[: -len("_memory")] if key.endswith("_memory") else key
    digits = "".join(ch for ch in base if ch.isdigit())
    return (int(digits) if digits else 10**9, 1 if key.endswith("_memory") else 0, key)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} %"


# ---------------------------------------------------------------------------------------------------
# GPUMemoryIncrease


@dataclass
class _MemGpu:
    values: Distribution = field(default_factory=Distribution)
    prev_mean: float = float("nan")  # mean of the node's previous window for this GPU
    max_increase: float | None = None
    violations: int = 0
    last_timestamp: int | None = None


@dataclass
class _MemNode:
    windows: Windows
    has_gpu: bool = False
    snapshots: int = 0
    n_windows: int = 0
    triggered: int = 0
    gpus: dict[str, _MemGpu] = field(default_factory=dict)
    flagged: Flagged = field(default_factory=Flagged)

    def freeze(self) -> None:
        """The node's data is complete: keep its statistics, not its values."""
        for acc in self.gpus.values():
            acc.values = Frozen(acc.values)  # type: ignore[assignment]


class GPUMemoryIncrease(Rule):
    """Per node and GPU: the mean memory utilization of each window (`window` snapshots after
    `patience`) against the previous window's; a rise of more than `increase` percentage points is a
    violation. Windows are equal in size: a trailing partial window is never compared.

    Evaluation points: each window of a node that has a previous window (all its GPUs at once);
    RuleTriggered counts those in which some GPU's memory rose too much, Violations the (window, GPU)
    pairs. Datapoints: snapshots in complete windows. Details[node][gpu]: `increase` (the largest
    window-to-window rise, percentage points), `gpu_max`, `p05`, box-plot stats of memory utilization,
    `violations`, `last_timestamp` (end of the last window that rose too much); Details["last_timestamp"]:
    the latest of them."""

    name = "GPUMemoryIncrease"
    metrics = (GPU_MEM_UTIL,)
    description = "Measures the average GPU memory footprint and triggers if there is a large increase."
    recommendation = ("Choose a larger instance type with more memory if footprint is close to maximum "
                      "available memory.")
    defaults = {"increase": 5, "patience": 1000, "window": 10}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window", "patience")
        self._nodes: dict[str, _MemNode] = {}

    def update(self, chunk: Chunk) -> None:
        inc = self.params["increase"]
        for node, frame in chunk.system.items():
            st = self._nodes.get(node)
            if st is None:
                st = self._nodes[node] = _MemNode(Windows(self.params["patience"], self.params["window"]))
            cols = gpu_series(frame, GPU_MEM_UTIL)
            st.has_gpu |= bool(cols) and len(frame) > 0
            done = node in chunk.done  # nothing more comes for it: a partial window is never compared
            block = st.windows.feed(frame.timestamps, cols, flush=chunk.final or done, partial_ok=False)
            if block is not None:
                self._judge(st, block, inc)
            if done:
                st.freeze()

    def merge(self, other: Rule, node: str) -> None:
        """Every statistic here is per node and the result orders nodes by name: `node`'s state is taken whole."""
        assert isinstance(other, GPUMemoryIncrease)
        take_node(self._nodes, other._nodes, node, lambda st: st.windows.seen)

    def _judge(self, st: _MemNode, block: Block, inc: float) -> None:
        """The windows `block` completes on one node."""
        st.snapshots += block.size
        st.n_windows += block.n_windows
        ends = block.ends()
        flagged = np.zeros(block.n_windows, bool)
        by_gpu: dict[str, np.ndarray] = {}
        for col, x in block.cols.items():
            acc = st.gpus.setdefault(device_of(col), _MemGpu())
            acc.values.add(x)
            means = block.means(x)
            rise = means - np.concatenate([[acc.prev_mean], means[:-1]])
            acc.prev_mean = float(means[-1])
            finite = rise[np.isfinite(rise)]
            if finite.size:
                top = float(finite.max())
                acc.max_increase = top if acc.max_increase is None else max(acc.max_increase, top)
            with np.errstate(invalid="ignore"):
                bad = rise > inc
            acc.violations += int(bad.sum())
            if bad.any():
                acc.last_timestamp = int(ends[np.flatnonzero(bad)[-1]])
            flagged |= bad
            by_gpu[device_of(col)] = bad
        # a node's first window, or a GPU's first window with data, has no previous mean: nothing compared
        st.triggered += int(flagged.sum())
        st.flagged.add(block, by_gpu)

    def result(self) -> RuleResult:
        nodes = {n: s for n, s in self._nodes.items() if s.has_gpu}
        if not nodes:
            return all_not_applicable(self, self._nodes, "GPU memory data")
        inc = self.params["increase"]
        details: dict[str, Any] = {}
        violations = triggered = datapoints = 0
        last: int | None = None
        findings: list[str] = []
        for node in sorted(nodes):
            st = nodes[node]
            datapoints += st.snapshots
            triggered += st.triggered
            per_gpu: dict[str, Any] = {}
            for gpu in ordered_columns(st.gpus):
                acc = st.gpus[gpu]
                v = acc.values
                violations += acc.violations
                entry: dict[str, Any] = {"increase": plain_float(acc.max_increase) if acc.max_increase is not None
                                         else None, "gpu_max": None, "p05": None}
                if v.n:
                    entry["gpu_max"] = plain_float(v.max())
                    entry["p05"] = plain_float(v.percentiles((5,))[0])
                    entry.update(rounded(v.box_stats()))
                entry.update({"violations": acc.violations, "last_timestamp": acc.last_timestamp})
                per_gpu[gpu] = entry
                if acc.last_timestamp is not None:
                    last = acc.last_timestamp if last is None else max(last, acc.last_timestamp)
                if acc.violations:
                    near = (entry["gpu_max"] or 0) >= 90
                    findings.append(
                        f"memory of {gpu} on node {node} rose by more than {inc} percentage points "
                        f"{acc.violations} time(s), by up to {entry['increase']:.1f} points (last at "
                        f"{when(acc.last_timestamp)}); its peak was {entry['gpu_max']:.0f} %"
                        + (", close to the maximum" if near else ""))
            details[node] = per_gpu
        details["last_timestamp"] = last
        details["flagged_windows"] = flagged_details(nodes)
        message = note_skipped(details, self._nodes, "GPU memory data")
        recommendation = None
        if findings:
            recommendation = (f"{listing(findings)}. Check for tensors kept alive across steps (a growing "
                              f"footprint ends in out-of-memory errors). {self.recommendation}")
        return self.make_result(triggered=triggered, violations=violations, datapoints=datapoints,
                                details=details, message=message, recommendation=recommendation)


# ---------------------------------------------------------------------------------------------------
# LoadBalancing

_BINS = 50  # 2 % wide, covering 0–100 % with 100 in the last bin
_BINEDGES = [float(x) for x in np.linspace(0.0, 100.0, _BINS + 1)]


@dataclass
class _LoadGpu:
    counts: np.ndarray = field(default_factory=lambda: np.zeros(_BINS, np.int64))
    total: float = 0.0  # sum of values, for the mean


@dataclass
class _LoadNode:
    seen: int = 0
    snapshots: int = 0
    has_gpu: bool = False
    gpu_count: int = 0  # GPUs seen, during patience too: a short run of an 8-GPU node is not "one GPU only"
    gpus: dict[str, _LoadGpu] = field(default_factory=dict)


def js_distance(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon distance of two histograms (counts, normalized here), natural log as SageMaker
    (scipy's default): sqrt of the divergence, 0 for equal histograms, at most sqrt(ln 2) ≈ 0.83."""
    p = p / p.sum()
    q = q / q.sum()
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log(a[nz] / m[nz])))

    return math.sqrt(max(0.0, (kl(p) + kl(q)) / 2))


class LoadBalancing(Rule):
    """Per node, a histogram of each GPU's utilization after `patience` (50 bins of 2 %, covering 0–100 %
    inclusive; values outside are clipped into range) and the Jensen–Shannon distance of every pair of
    its GPUs.

    Evaluation points: the pairs of GPUs of a node, judged on their whole-run histograms (counts, so one
    chunk or many give the same); RuleTriggered and Violations both count pairs further apart than
    `threshold`. Datapoints: snapshots after patience of nodes with GPUs. Details[node]: `workloads`
    {gpu: counts per bin}, `binedges`, `distances` {gpuA: {gpuB: d}} for every pair, `mean_utilization`
    {gpu: %}, `imbalanced` [[gpuA, gpuB, d], …], `gpus` (how many it had, counted during patience too); and
    `nothing_to_compare` when every node had one GPU (the rule never judges such a run, however long)."""

    name = "LoadBalancing"
    metrics = (GPU_UTIL,)
    description = ("Detects workload balancing issues across GPUs. Workload imbalance can occur in training jobs "
                   "with data parallelism. The gradients are accumulated on a primary GPU, and this GPU might be "
                   "overused with regard to other GPUs, resulting in reducing the efficiency of data "
                   "parallelization.")
    recommendation = ("Choose a different distributed training strategy or a different distributed training "
                      "framework.")
    defaults = {"threshold": 0.2, "patience": 1000}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "patience")
        self._nodes: dict[str, _LoadNode] = {}

    def update(self, chunk: Chunk) -> None:
        for node, frame in chunk.system.items():
            st = self._nodes.setdefault(node, _LoadNode())
            n = len(frame)
            skip = skip_patience(st.seen, n, self.params["patience"])
            st.seen += n
            cols = gpu_series(frame, GPU_UTIL)
            st.has_gpu |= bool(cols) and n > 0
            if n > 0:
                st.gpu_count = max(st.gpu_count, len(cols))
            st.snapshots += n - skip
            if n - skip == 0:
                continue
            for col, x in cols.items():
                v = x[skip:]
                v = v[~np.isnan(v)]
                acc = st.gpus.setdefault(device_of(col), _LoadGpu())
                if v.size:
                    v = np.clip(v, 0.0, 100.0)
                    idx = np.minimum((v * (_BINS / 100.0)).astype(np.int64), _BINS - 1)
                    acc.counts += np.bincount(idx, minlength=_BINS)
                    acc.total += float(v.sum())

    def merge(self, other: Rule, node: str) -> None:
        """Every statistic here is per node and the result orders nodes by name: `node`'s state is taken whole."""
        assert isinstance(other, LoadBalancing)
        take_node(self._nodes, other._nodes, node, lambda st: st.seen)

    def result(self) -> RuleResult:
        nodes = {n: s for n, s in self._nodes.items() if s.has_gpu}
        if not nodes:
            return all_not_applicable(self, self._nodes)
        thr = self.params["threshold"]
        details: dict[str, Any] = {}
        violations = datapoints = 0
        findings: list[str] = []
        single = []
        for node in sorted(nodes):
            st = nodes[node]
            datapoints += st.snapshots
            gpus = [g for g in ordered_columns(st.gpus) if st.gpus[g].counts.sum() > 0]
            means = {g: plain_float(st.gpus[g].total / st.gpus[g].counts.sum(), 2) for g in gpus}
            distances: dict[str, dict[str, float]] = {}
            imbalanced: list[list[Any]] = []
            for i, a in enumerate(gpus):
                for b in gpus[i + 1:]:
                    d = js_distance(st.gpus[a].counts.astype(float), st.gpus[b].counts.astype(float))
                    distances.setdefault(a, {})[b] = round(d, 4)
                    if d > thr:
                        imbalanced.append([a, b, round(d, 4)])
            violations += len(imbalanced)
            if st.gpu_count < 2:
                single.append(node)
            details[node] = {"workloads": {g: st.gpus[g].counts.tolist() for g in gpus}, "binedges": _BINEDGES,
                             "distances": distances, "mean_utilization": means, "imbalanced": imbalanced,
                             "gpus": st.gpu_count}
            for a, b, d in imbalanced:
                findings.append(f"on node {node} {a} and {b} had different workloads (distance {d:.2f} > {thr}; "
                                f"mean utilization {means[a]:.0f} % vs {means[b]:.0f} %)")
        message = note_skipped(details, self._nodes)
        if single:
            message = "; ".join(filter(None, [message, f"one GPU only, nothing to balance: {', '.join(single)}"]))
            if len(single) == len(nodes):
                details["nothing_to_compare"] = True  # however long the run: not a run too short to judge
        recommendation = f"{listing(findings)}. {self.recommendation}" if findings else None
        return self.make_result(triggered=violations, violations=violations, datapoints=datapoints,
                                details=details, message=message, recommendation=recommendation)
