"""MemoryGrowth: memory that grows with steps — a leak (a list that keeps each step's loss tensor, a cache without
a bound) — judged per rank from the memory each step records (analyze/memory.py): host RSS and, on CUDA, the
allocator's allocated bytes. A robust slope (Theil–Sen over per-window medians, after warm-up) that persists into
the run's second half fires; warm-up and caches that plateau stay silent. Says the rate in MB per 1,000 steps,
when it would reach the limit (the cgroup's, the machine's, the GPU's), and, after the automatic capture, the
lines that allocate it (tracemalloc top sites, as the job recorded them)."""

from __future__ import annotations

import json
import math
import statistics  # a window's median: 30x cheaper than numpy's on 20 values
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from stallwatch.analyze.finding import HIGH, LISTED_STEPS, MEDIUM, Finding, Where, finding
from stallwatch.analyze.framework_frame import new_events, rank_key
from stallwatch.analyze.memory import CUDA_ALLOC, LABELS, RSS, memory_columns, theil_sen
from stallwatch.analyze.rules.base import Chunk, ParameterError, Rule, RuleResult
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import GLOBAL, MEMORY_LIMIT, OOM, STEP, TRAIN

KB_PER_MB = 1024.0
MEMORY_SITES = "memory_sites"  # the kind of the event a capture records its top allocation sites with
CUDA_SNAPSHOT = "cuda_memory_snapshot"  # the kind of the event naming a kept CUDA allocator history
MAX_SITES = 10
MAX_ARGS_CHARS = 200_000  # a sites event larger than this is not read (a run directory is untrusted)
JUDGED = (RSS, CUDA_ALLOC)  # reserved plateaus with the cache, peak only rises: neither says "leak" alone
PROFILING = "profiling"  # the framework-event kind that marks a profiling window (torch/windows.py)
# Captures whose profiler allocates in the job: torch.profiler keeps every event, cProfile/pyinstrument their
# stats, tracemalloc its traces. The memory they take (and the allocator keeps) is not the job's growth.
CAPTURE_LAYERS = ("detailed", "python", "memory")


@dataclass(frozen=True)
class Site:
    """One allocation site of a capture: what it allocated between two snapshots a few steps apart."""

    file: str
    line: int
    size_kb: float  # grown between the snapshots
    count: int  # blocks grown
    traceback: list[str] = field(default_factory=list)  # "file:line" outermost first
    kind: str = "heap"  # tensors: tensors made there and still alive (their storage's bytes); heap: Python's heap

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Capture:
    """What the job recorded when it captured where memory grows (docs/format.md, `memory_sites`)."""

    node: str
    rank: int
    start_us: int
    first_step: int
    last_step: int
    grown_kb: float  # the traced heap's growth between the snapshots
    cost_ms: float  # the capture's own time in the training thread
    sites: list[Site]
    cuda_snapshot: str | None = None  # the run-relative path of the CUDA allocator history kept, if any


@dataclass(frozen=True)
class SeriesGrowth:
    """One rank's one memory series (`metric`: rss_kb or cuda_alloc_kb), judged."""

    node: str
    rank: int
    metric: str
    steps: int  # steps with a reading
    windows: int  # per-window medians judged (after patience, profiling windows left out)
    since_step: int  # the first step judged
    last_step: int
    start_mb: float
    last_mb: float
    rate_mb_per_1000: float  # Theil–Sen over the judged windows
    late_rate_mb_per_1000: float  # the same over the second half alone: growth that persists
    growth_mb: float  # rate × the judged steps
    limit_mb: float | None
    limit_source: str | None  # cgroup, machine, gpu
    steps_to_limit: float | None
    time_to_limit_s: float | None
    step_s: float  # mean step time
    within_horizon: bool  # it reaches the limit before the run has run as many steps again
    triggered: bool
    left_out: int = 0  # windows of steps left out: inside a profiling capture, or the first after one
    captures: int = 0  # profiling captures that split the series (a step across one is not a slope)

    @property
    def key(self) -> str:
        return f"{rank_key(self.node, self.rank)}:{self.metric}"


@dataclass(frozen=True)
class MemoryDeath:
    """How the job died of memory, for the run's verdict: `head` says what killed it and at how much of which
    limit, `growth` how memory grew before it (empty when no series could be judged)."""

    kind: str  # oom_killer (the kernel's, counted in the cgroup), sigkill_near_limit, host, cuda
    node: str
    rank: int | None
    error: str | None  # the exception, for host and cuda
    at_mb: float | None
    limit_mb: float | None
    limit: str | None  # what the limit is: cgroup, machine, address space (RLIMIT_AS), gpu
    rate_mb_per_1000: float | None
    since_step: int | None
    head: str
    growth: str


@dataclass(frozen=True)
class MemoryGrowthDetails:
    """The rule's Details: every judged series, the fired ones, the captures the job recorded, the headline."""

    series: dict[str, SeriesGrowth]
    fired: list[str]
    captures: list[Capture]
    title: str | None
    time_at_stake_s: float | None
    ranks_fired: list[str]
    nodes: list[str]
    death: MemoryDeath | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> MemoryGrowthDetails:
        """The Details of a result (raises KeyError/TypeError on another shape: the findings fall back)."""
        captures = [Capture(**{**c, "sites": [Site(**s) for s in c["sites"]]}) for c in d["captures"]]
        death = MemoryDeath(**d["death"]) if isinstance(d.get("death"), dict) else None
        return MemoryGrowthDetails({k: SeriesGrowth(**v) for k, v in d["series"].items()},
                                   [str(x) for x in d["fired"]], captures, d.get("title"), d.get("time_at_stake_s"),
                                   [str(x) for x in d["ranks_fired"]], [str(x) for x in d["nodes"]], death)

    @property
    def top(self) -> SeriesGrowth | None:
        fired = [self.series[k] for k in self.fired]
        return max(fired, key=lambda s: (s.within_horizon, s.rate_mb_per_1000)) if fired else None

    def capture_of(self, node: str, rank: int) -> Capture | None:
        mine = [c for c in self.captures if c.node == node and c.rank == rank]
        return mine[-1] if mine else None


class _Series:
    """One (node, rank, mode, metric) series as window medians: a window's values are kept until it is full, then
    reduced to their median (the same whichever chunks brought them)."""

    __slots__ = ("done", "last", "n", "open", "spans")

    def __init__(self) -> None:
        self.open: dict[int, list[int]] = {}
        self.done: dict[int, float] = {}
        self.spans: dict[int, tuple[int, int]] = {}  # window -> (first start, last end) of its steps, µs
        self.n = 0
        self.last = (-1, 0)  # (end_us, KiB) of the latest step

    def add(self, buckets: np.ndarray, values: np.ndarray, starts_us: np.ndarray, ends_us: np.ndarray,
            window: int) -> None:
        self.n += int(values.size)
        i = int(np.argmax(ends_us))
        self.last = max(self.last, (int(ends_us[i]), int(values[i])))
        order = np.argsort(buckets, kind="stable")
        by_bucket, vals = buckets[order], values[order]
        t0, t1 = starts_us[order], ends_us[order]
        uniq, starts = np.unique(by_bucket, return_index=True)
        ends = np.append(starts[1:], by_bucket.size)
        for b, lo, hi in zip(uniq.tolist(), starts.tolist(), ends.tolist()):
            self._span(b, int(t0[lo:hi].min()), int(t1[lo:hi].max()))
            if b in self.done:  # a window full already: a step seen twice, ignore
                continue
            held = self.open.setdefault(b, [])
            held += vals[lo:hi].tolist()
            if len(held) >= window:
                self.done[b] = float(statistics.median(held))
                del self.open[b]

    def _span(self, bucket: int, lo: int, hi: int) -> None:
        had = self.spans.get(bucket)
        self.spans[bucket] = (lo, hi) if had is None else (min(had[0], lo), max(had[1], hi))

    def merge(self, other: _Series, window: int) -> None:
        self.n += other.n
        self.last = max(self.last, other.last)
        self.done.update(other.done)
        for b, (lo, hi) in other.spans.items():
            self._span(b, lo, hi)
        for b, vals in other.open.items():
            if b in self.done:
                continue
            held = self.open.setdefault(b, [])
            held += vals
            if len(held) >= window:
                self.done[b] = float(statistics.median(held))
                del self.open[b]

    def medians(self) -> dict[int, float]:
        out = dict(self.done)
        out.update({b: float(statistics.median(v)) for b, v in self.open.items() if v})
        return out


class MemoryGrowth(Rule):
    """Per rank: the memory each step recorded (host RSS; on CUDA, the allocator's allocated bytes) against the step
    number. After the first `patience` steps, the median of each `window` steps; the Theil–Sen slope over those
    medians. A series fires when the slope is at least `min_rate_mb` MB per 1,000 steps, the slope of the second
    half is at least `persist` × it (a warm-up that plateaus fails this), and the growth over the judged steps is at
    least `min_growth_mb` MB.

    Evaluation points: each rank's series. RuleTriggered = series that fire; Violations = the same; Datapoints =
    steps with a memory reading. Windows are reduced to medians only when full, so one chunk or many give the same
    result."""

    name = "MemoryGrowth"
    metrics = ()
    description = ("Fits the memory each step records (host RSS, and on CUDA the allocator's allocated bytes) "
                   "against the step number, per rank, after warm-up: memory that keeps growing with steps runs "
                   "out sooner or later. Warm-up and caches that plateau do not fire it.")
    recommendation = ("Find what keeps a reference to each step's tensors: a list of losses or outputs appended to "
                      "every step (append loss.item() or loss.detach(), not loss), a cache or dict without a bound, "
                      "hooks registered every step, a growing history in a logger.")
    defaults: ClassVar[dict[str, Any]] = {"min_rate_mb": 10.0, "min_growth_mb": 20.0, "persist": 0.5, "patience": 50, "window": 20,
                "min_windows": 6}

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """A leak: high when it reaches its limit before the run has run as long again (the run's work so far is then
        at stake), else medium; where the capture saw it allocated, the line is in the title and the evidence."""
        return findings_of(result, summary)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        for key, lo, top in (("min_rate_mb", 0.0, 1e9), ("min_growth_mb", 0.0, 1e12), ("persist", 0.0, 1.0)):
            v = self.params[key]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not lo <= v <= top:
                raise ParameterError(f"{self.name}.{key}={v!r}: must be a number from {lo:g} to {top:g}")
        for key, lo in (("patience", 0), ("window", 1), ("min_windows", 3)):
            v = self.params[key]
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= 10**9:
                raise ParameterError(f"{self.name}.{key}={v!r}: must be a whole number of at least {lo}")
        self._series: dict[tuple[str, int, str, str], _Series] = {}
        self._time: dict[tuple[str, int, str], list[int]] = {}  # steps, µs
        self._limits: dict[tuple[str, int, str], int] = {}  # (node, rank, cgroup|gpu) -> bytes
        self._machine: dict[str, int] = {}  # node -> memory_total_bytes
        self._captures: dict[tuple[str, int, int], Capture] = {}
        self._profiled: dict[tuple[str, int], set[tuple[int, int]]] = {}  # (node, rank) -> capture windows, µs
        self._snapshots: dict[tuple[str, int], str] = {}
        self._ooms: dict[tuple[str, int], tuple[int, str, dict[str, Any]]] = {}  # the job's allocation failures
        self._ends: dict[str, dict[str, Any]] = {}  # node -> how its job ended (signal, the OOM killer's count)
        self._events = 0

    def update(self, chunk: Chunk) -> None:
        for node, rec in ((chunk.run or {}).get("nodes") or {}).items():
            total = rec.get("memory_total_bytes") if isinstance(rec, dict) else None
            if isinstance(total, int) and not isinstance(total, bool) and total > 0:
                self._machine[node] = total
            if isinstance(rec, dict) and rec.get("exit_code") is not None:
                self._ends[node] = {k: rec.get(k) for k in ("exit_code", "exit_signal", "oom_kills",
                                                            "memory_limit_bytes", "memory_peak_bytes")}
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        window = int(self.params["window"])
        mem = memory_columns(cols, JUDGED)
        steps = cols.kind_is(STEP) & (cols.step >= 0) & cols.mode_is((TRAIN, GLOBAL))
        for (node, rank, mode), rows in cols.groups(steps):
            t = self._time.setdefault((node, rank, mode), [0, 0])
            t[0] += len(rows)
            t[1] += int(np.maximum(cols.end[rows] - cols.start[rows], 0).sum())
            for metric in JUDGED:
                values = mem[metric][rows]
                ok = values >= 0
                if not ok.any():
                    continue
                series = self._series.setdefault((node, rank, mode, metric), _Series())
                series.add(cols.step[rows][ok] // window, values[ok], cols.start[rows][ok], cols.end[rows][ok],
                           window)
        for (node, rank), rows in cols.groups(cols.kind_is(PROFILING), by_mode=False):
            layers = cols.table["name"].take(rows).to_pylist()
            args = cols.table["args"].take(rows).to_pylist()
            held = self._profiled.setdefault((node, rank), set())
            held.update((int(cols.start[i]), OPEN if _started(text) else int(cols.end[i]))
                        for i, layer, text in zip(rows.tolist(), layers, args)
                        if layer in CAPTURE_LAYERS and cols.end[i] >= cols.start[i])
        for kind in (MEMORY_LIMIT, MEMORY_SITES, CUDA_SNAPSHOT, OOM):
            for (node, rank), rows in cols.groups(cols.kind_is(kind), by_mode=False):
                for i in rows.tolist():
                    self._marker(kind, node, rank, cols, i)

    def _marker(self, kind: str, node: str, rank: int, cols: Any, i: int) -> None:
        args = cols.table["args"][i].as_py() or ""
        name = cols.table["name"][i].as_py() or ""
        if len(args) > MAX_ARGS_CHARS:
            return
        try:
            data = json.loads(args) if args else {}
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        if kind == MEMORY_LIMIT:
            value = data.get("bytes")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0 and name in ("cgroup", "gpu"):
                self._limits[(node, rank, name)] = value
        elif kind == OOM:
            if name in ("host", "cuda"):
                self._ooms[(node, rank)] = max(self._ooms.get((node, rank), (-1, "", {})),
                                               (int(cols.start[i]), name, data), key=lambda x: x[0])
        elif kind == CUDA_SNAPSHOT:
            path = data.get("path")
            if isinstance(path, str) and len(path) < 1000:
                self._snapshots[(node, rank)] = path
        else:
            capture = _capture(node, rank, int(cols.start[i]), data)
            if capture is not None:
                self._captures[(node, rank, capture.start_us)] = capture

    def merge(self, other: Rule, node: str) -> None:
        """Fold in `other`, fed only `node`'s chunks: its series, times, limits and captures of `node`."""
        assert isinstance(other, MemoryGrowth)
        self._events += other._events
        window = int(self.params["window"])
        for key, s in other._series.items():
            if key[0] == node:
                self._series.setdefault(key, _Series()).merge(s, window)
        for key, t in other._time.items():
            if key[0] == node:
                mine = self._time.setdefault(key, [0, 0])
                mine[0] += t[0]
                mine[1] += t[1]
        self._limits.update({k: v for k, v in other._limits.items() if k[0] == node})
        self._captures.update({k: v for k, v in other._captures.items() if k[0] == node})
        for k, v in other._profiled.items():
            if k[0] == node:
                self._profiled.setdefault(k, set()).update(v)
        self._snapshots.update({k: v for k, v in other._snapshots.items() if k[0] == node})
        self._ooms.update({k: v for k, v in other._ooms.items() if k[0] == node})
        if node in other._ends:
            self._ends[node] = other._ends[node]
        if node in other._machine:
            self._machine[node] = other._machine[node]

    def result(self) -> RuleResult:
        if (self._events == 0 or not self._time) and not self._ooms:
            return self.not_applicable("no framework data: the job recorded no steps (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        if not self._series and not self._ooms:
            return self.not_applicable("the steps do not record memory (a run recorded before it was measured, or "
                                       "a system without /proc)")
        judged: dict[str, SeriesGrowth] = {}
        for (node, rank, mode, metric), s in sorted(self._series.items()):
            other = GLOBAL if mode == TRAIN else TRAIN
            if mode == GLOBAL and (node, rank, other, metric) in self._series:
                continue  # a rank with training steps is judged on them
            g = self._judge(node, rank, mode, metric, s)
            if g is not None:
                judged[g.key] = g
        fired = [k for k, g in judged.items() if g.triggered]
        captures = []
        for key in sorted(self._captures):
            c = self._captures[key]
            snap = self._snapshots.get((c.node, c.rank))
            captures.append(Capture(**{**asdict(c), "sites": c.sites, "cuda_snapshot": snap}))
        if not captures:
            captures = [Capture(n, r, 0, -1, -1, 0.0, 0.0, [], p) for (n, r), p in sorted(self._snapshots.items())]
        ranks_fired = sorted({rank_key(judged[k].node, judged[k].rank) for k in fired})
        nodes = sorted({judged[k].node for k in fired})
        death = self._death(judged)
        details = MemoryGrowthDetails(judged, fired, captures, None, None, ranks_fired, nodes, death)
        top = details.top
        if top is not None:
            stake = None
            if top.within_horizon or death is not None:  # the job dies of it: its training so far is at stake
                stake = round(sum(t[1] for k, t in self._time.items() if (k[0], k[1]) == (top.node, top.rank)) / 1e6,
                              6)
            details = MemoryGrowthDetails(judged, fired, captures, _title(top, details.capture_of(top.node, top.rank)),
                                          stake, ranks_fired, nodes, death)
        datapoints = sum(s.n for s in self._series.values())
        return self.make_result(triggered=len(fired), violations=len(fired), datapoints=datapoints,
                                details=details.to_json(), recommendation=_advice(details) if fired else None)

    def _judge(self, node: str, rank: int, mode: str, metric: str, s: _Series) -> SeriesGrowth | None:
        window, patience = int(self.params["window"]), int(self.params["patience"])
        medians = s.medians()
        after = sorted(b for b in medians if b * window >= patience)
        buckets, segment, left_out, splits = _outside_captures(after, s.spans, _windows(self._profiled.get((node, rank),
                                                                                                  set())))
        if len(buckets) < int(self.params["min_windows"]):
            return None
        x = np.array([b * window + (window - 1) / 2.0 for b in buckets])
        y = np.array([medians[b] for b in buckets])  # KiB
        seg = np.array(segment, np.int64)
        rate = theil_sen(x, y, seg) * 1000.0 / KB_PER_MB
        half = len(buckets) // 2
        late = theil_sen(x[half:], y[half:], seg[half:]) * 1000.0 / KB_PER_MB
        span = float(x[-1] - x[0])
        growth = rate * span / 1000.0
        steps, us = self._time.get((node, rank, mode), [0, 0])
        step_s = us / steps / 1e6 if steps else 0.0
        last_kb = float(s.last[1])
        limit, source = self._limit(node, rank, metric)
        to_limit = time_to = None
        if limit is not None and rate > 0:
            to_limit = max((limit / 1024.0 - last_kb) / KB_PER_MB, 0.0) / rate * 1000.0
            time_to = to_limit * step_s
        fires = (rate >= float(self.params["min_rate_mb"]) and late >= float(self.params["persist"]) * rate
                 and growth >= float(self.params["min_growth_mb"]))
        last_step = buckets[-1] * window + window - 1
        horizon = fires and to_limit is not None and to_limit <= max(last_step, 1)
        return SeriesGrowth(node, rank, metric, s.n, len(buckets), buckets[0] * window, last_step,
                            round(float(y[0]) / KB_PER_MB, 3), round(last_kb / KB_PER_MB, 3), round(rate, 3),
                            round(late, 3), round(growth, 3),
                            round(limit / 2**20, 3) if limit is not None else None, source,
                            round(to_limit, 1) if to_limit is not None else None,
                            round(time_to, 3) if time_to is not None else None, round(step_s, 6), horizon, fires,
                            left_out, splits)

    def _death(self, judged: dict[str, SeriesGrowth]) -> MemoryDeath | None:
        """The job's death of memory, if it died of it: an allocation failure it recorded (host or CUDA), a kill by
        the kernel's OOM killer (counted by the launcher in the job's cgroup), or a SIGKILL with memory within
        NEAR_LIMIT of its limit."""
        def growth(node: str, rank: int | None, metric: str) -> SeriesGrowth | None:
            mine = [g for g in judged.values() if g.node == node and g.metric == metric and rank in (None, g.rank)]
            return max(mine, key=lambda g: g.last_mb) if mine else None

        for (node, rank), (_, kind, data) in sorted(self._ooms.items()):
            end = self._ends.get(node) or {}
            if end.get("exit_code") in (None, 0):
                continue
            error = str(data.get("error") or "")[:300] or None
            g = growth(node, rank, RSS if kind == "host" else CUDA_ALLOC)
            if kind == "cuda":
                cuda = data.get("cuda") if isinstance(data.get("cuda"), dict) else {}
                at, limit, what = _kb_mb(cuda.get("allocated_kb")), _kb_mb(cuda.get("total_kb")), "gpu"
                head = "ran out of GPU memory" + (f" ({_short(error)})" if error else "")
                if at is not None and limit is not None:
                    head += f" at {_mb(at)} allocated of a {_mb(limit)} GPU"
            else:
                rss, vm = _kb_mb(data.get("rss_kb")), _kb_mb(data.get("vm_kb"))
                rlimit, cgroup = _b_mb(data.get("rlimit_as_bytes")), _b_mb(data.get("cgroup_limit_bytes"))
                head = "ran out of memory" + (f" ({_short(error)})" if error else "")
                if rlimit is not None and vm is not None:
                    at, limit, what = vm, rlimit, "address space (RLIMIT_AS)"
                    head += f" at {_mb(vm)} of address space of a {_mb(rlimit)} limit (RLIMIT_AS)"
                else:
                    limit = cgroup if cgroup is not None else _b_mb(self._machine.get(node))
                    at, what = rss, "cgroup" if cgroup is not None else "machine"
                    if rss is not None:
                        head += f" at {_mb(rss)}" + (f" of a {_mb(limit)} {what} limit" if limit is not None else "")
            return MemoryDeath(kind, node, rank, error, at, limit, what, g.rate_mb_per_1000 if g else None,
                               g.since_step if g else None, head, _growth_text(g))
        for node, end in sorted(self._ends.items()):
            if end.get("exit_signal") != "SIGKILL":
                continue
            g = growth(node, None, RSS)
            kills = end.get("oom_kills")
            limit_b = end.get("memory_limit_bytes")
            limit = _b_mb(limit_b) if limit_b else (g.limit_mb if g is not None else None)
            what = "cgroup" if limit_b else (g.limit_source if g is not None else None)
            peak = _b_mb(end.get("memory_peak_bytes")) if limit_b else None  # the cgroup's own count
            at = peak if peak is not None else g.last_mb if g is not None else None
            of = f" at {_mb(at)}" + (f" of a {_mb(limit)} limit" if limit is not None else "") if at is not None else ""
            if isinstance(kills, int) and kills > 0:
                return MemoryDeath("oom_killer", node, g.rank if g else None, None, at, limit, what,
                                   g.rate_mb_per_1000 if g else None, g.since_step if g else None,
                                   f"was killed by the out-of-memory killer{of}", _growth_text(g))
            if at is not None and limit is not None and at >= NEAR_LIMIT * limit:
                return MemoryDeath("sigkill_near_limit", node, g.rank if g else None, None, at, limit, what,
                                   g.rate_mb_per_1000 if g else None, g.since_step if g else None,
                                   f"was killed by SIGKILL{of}, most likely by the out-of-memory killer",
                                   _growth_text(g))
        return None

    def _limit(self, node: str, rank: int, metric: str) -> tuple[int | None, str | None]:
        """The bytes the series can grow to: the GPU's memory, or the tighter of the cgroup's limit and the
        machine's memory."""
        if metric != RSS:
            gpu = self._limits.get((node, rank, "gpu"))
            return (gpu, "gpu") if gpu else (None, None)
        found = [(v, src) for v, src in ((self._limits.get((node, rank, "cgroup")), "cgroup"),
                                         (self._machine.get(node), "machine")) if v]
        return min(found) if found else (None, None)


OPEN = 1 << 62  # the end of a capture that has begun and not yet ended (its `started` event alone is in)


def _started(args: str | None) -> bool:
    """Whether a profiling event marks a capture's beginning (its window's own event follows when it ends)."""
    try:
        value = json.loads(args) if args and len(args) <= MAX_ARGS_CHARS else None
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and value.get("status") == "started"


def _windows(held: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The captures' time windows: each ended one as recorded; one only begun, from its start on (a live evaluation
    during the capture must not read the profiler's memory as the job's)."""
    ended = {start for start, end in held if end != OPEN}
    return sorted((start, end) for start, end in held if end != OPEN or start not in ended)


def _outside_captures(buckets: list[int], spans: dict[int, tuple[int, int]],
                      windows: list[tuple[int, int]]) -> tuple[list[int], list[int], int, int]:
    """The windows of steps to judge, each with its segment (how many profiling captures ended before it), how many
    were left out, and how many captures split the series. A window whose steps overlap a capture is left out (the
    profiler's memory rises inside it), and so is the first one after it (its export, the allocator settling);
    across a capture the series is cut in two, so the step up the profiler's kept buffers leave is no slope
    while a leak's growth on either side still is."""
    if not windows:
        return buckets, [0] * len(buckets), 0, 0
    ends = np.array(sorted(e for _, e in windows), np.int64)
    kept: list[int] = []
    segment: list[int] = []
    left_out = 0
    settled: set[int] = set()  # captures whose first window after has been left out
    for b in buckets:
        lo, hi = spans.get(b, (0, -1))
        if hi < lo or any(lo <= e and w <= hi for w, e in windows):
            left_out += 1  # no span known (a run before spans were kept cannot say) or inside a capture
            continue
        k = int(np.searchsorted(ends, lo, side="left"))  # captures ended before this window's first step
        if k and k not in settled:
            settled.add(k)
            left_out += 1
            continue
        kept.append(b)
        segment.append(k)
    used = len(set(segment))
    return kept, segment, left_out, max(used - 1, 0)


def _capture(node: str, rank: int, start_us: int, data: dict[str, Any]) -> Capture | None:
    """A capture's sites from an event's args, each field checked (a run directory is untrusted)."""
    sites = []
    for s in data.get("sites") or []:
        if not isinstance(s, dict):
            continue
        f, line = s.get("file"), s.get("line")
        if not isinstance(f, str) or not isinstance(line, int) or isinstance(line, bool):
            continue
        tb = [str(x)[:500] for x in s.get("traceback") or [] if isinstance(x, str)][:20]
        kind = "tensors" if s.get("kind") == "tensors" else "heap"
        sites.append(Site(f[:500], line, _num(s.get("size_kb")), int(_num(s.get("count"))), tb, kind))
        if len(sites) >= MAX_SITES:
            break
    steps = data.get("steps") or [-1, -1]
    if not (isinstance(steps, list) and len(steps) == 2 and all(isinstance(v, int) for v in steps)):
        steps = [-1, -1]
    return Capture(node, rank, start_us, steps[0], steps[1], _num(data.get("grown_kb")), _num(data.get("cost_ms")),
                   sites)


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else 0.0


NEAR_LIMIT = 0.9  # a SIGKILL with memory at this share of its limit reads as the OOM killer's


def _kb_mb(value: Any) -> float | None:
    return round(value / 1024, 3) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _b_mb(value: Any) -> float | None:
    return round(value / 2**20, 3) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _short(error: str) -> str:
    """The exception in a few words: its type and the allocator's own phrase where there is one."""
    kind, _, text = error.partition(": ")
    for phrase in ("can't allocate memory", "CUDA out of memory", "Unable to allocate", "Cannot allocate memory"):
        if phrase.lower() in text.lower():
            return f"{kind}: {phrase}"
    return f"{kind}: {text[:80]}" if text else kind


def _growth_text(g: SeriesGrowth | None) -> str:
    if g is None or g.rate_mb_per_1000 <= 0:
        return ""
    return f"memory grew {g.rate_mb_per_1000:,.0f} MB per 1,000 steps since step {g.since_step:,}"


def _mb(value: float) -> str:
    return f"{value / 1024:.1f} GB" if value >= 1024 else f"{value:.0f} MB"


def _title(top: SeriesGrowth, capture: Capture | None) -> str:
    what = LABELS.get(top.metric, top.metric)
    head = (f"{what[0].upper()}{what[1:]} grows {top.rate_mb_per_1000:,.0f} MB per 1,000 steps on rank "
            f"{top.node}/{top.rank} since step {top.since_step:,}")
    if top.time_to_limit_s is not None and top.limit_mb is not None:
        head += (f": it reaches the {top.limit_source} limit ({_mb(top.limit_mb)}) in about "
                 f"{top.steps_to_limit:,.0f} steps")
    if capture is not None and capture.sites:
        head += f"; allocated at {capture.sites[0].where}"
    return head


def _advice(d: MemoryGrowthDetails) -> str:
    lines = []
    for key in d.fired[:8]:
        g = d.series[key]
        text = (f"On rank {g.node}/{g.rank}, {LABELS.get(g.metric, g.metric)} grew from {_mb(g.start_mb)} to "
                f"{_mb(g.last_mb)} ({g.rate_mb_per_1000:.1f} MB per 1,000 steps since step {g.since_step:,})")
        if g.steps_to_limit is not None and g.limit_mb is not None:
            text += f"; at this rate it reaches the {g.limit_source} limit of {_mb(g.limit_mb)} in " \
                    f"{g.steps_to_limit:,.0f} steps"
            if g.time_to_limit_s is not None:
                text += f" (about {g.time_to_limit_s / 60:.0f} min)"
        capture = d.capture_of(g.node, g.rank)
        if capture is not None and capture.sites:
            tops = ", ".join(f"{s.where} (+{s.size_kb / 1024:.1f} MB)" for s in capture.sites[:3])
            text += f". The automatic capture saw it allocated at {tops}"
        lines.append(text + ".")
    if not any(d.capture_of(d.series[k].node, d.series[k].rank) for k in d.fired):
        lines.append("Run live (`stallwatch run`) to have the lines that allocate it captured (tracemalloc).")
    lines.append(MemoryGrowth.recommendation)
    return " ".join(lines)


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    d = MemoryGrowthDetails.from_json(r.details)
    top = d.top
    if not r.fired or top is None:
        return []
    evidence: dict[str, Any] = {}
    for key in d.fired[:16]:
        g = d.series[key]
        evidence[key] = {"rate_mb_per_1000_steps": g.rate_mb_per_1000, "since_step": g.since_step,
                         "start_mb": g.start_mb, "last_mb": g.last_mb, "limit_mb": g.limit_mb,
                         "limit": g.limit_source, "steps_to_limit": g.steps_to_limit,
                         "time_to_limit_s": g.time_to_limit_s}
    capture = d.capture_of(top.node, top.rank)
    if capture is not None:
        evidence["sites"] = [{"where": x.where, "grown_mb": round(x.size_kb / 1024, 3), "traceback": x.traceback}
                             for x in capture.sites[:5]]
        if capture.cuda_snapshot:
            evidence["cuda_snapshot"] = capture.cuda_snapshot
    fired = [d.series[k] for k in d.fired]
    steps = sorted({g.since_step for g in fired})[:LISTED_STEPS]
    return [finding(r, s, "memory", d.title or "Memory grows with steps", d.time_at_stake_s,
                    Where(d.nodes, d.ranks_fired, steps), evidence,
                    severity=HIGH if top.within_horizon or d.death is not None else MEDIUM)]
