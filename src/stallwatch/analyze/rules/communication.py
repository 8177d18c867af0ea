"""CommunicationBound: does the training step wait for its collectives? Per rank, the exposed part of the gradient
all-reduce (and of the collectives the loop calls itself) — the time the step waited after backward's computation
was done — as a share of step time, over windows of steps; what it reduced, the bandwidth that implies, the node's
link, and advice in the job's terms (bucket_cap_mb, gradient_as_bucket_view, no_sync accumulation, FSDP/ZeRO, the
interconnect). The part of a rank's wait that is waiting for a slower rank is Straggler's: per window of steps only
the least any rank typically waited — the transfer itself — is counted; and of a window's steps the lower quartile,
so that steps held up by a busy machine (the collective's threads waiting for a CPU) do not make a compute-bound job
look communication-bound."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from stallwatch.analyze.collectives import DDP_EVENT, averages
from stallwatch.analyze.finding import LISTED_WINDOWS, Finding, Where, finding, over_all_steps
from stallwatch.analyze.framework_frame import new_events
from stallwatch.analyze.rules.base import Chunk, ParameterError, Rule, RuleResult
from stallwatch.analyze.rules.kit.checks import check_counts
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import COLLECTIVE, DDP_CONFIG, DDP_SYNC, STEP, TRAIN

SYNC_EVENT, CONFIG_KIND = DDP_SYNC, DDP_CONFIG  # torch/ddp_sync.py: a step's exposed all-reduce; a model's settings
MEASURED, SAMPLED, CALLS = "measured", "ddp_samples", "collectives"
MIN_STEPS = 20  # steps after patience before a rank is judged
US = 1_000_000
FSDP_NAMES = ("all_gather_into_tensor", "reduce_scatter_tensor", "_all_gather_base", "_reduce_scatter_base")


@dataclass(frozen=True)
class RankComm:
    """One rank's communication per TRAIN step (after patience). `comm_s` is the typical exposed time (per window,
    the lower quartile of its steps', the least of any rank's) times the steps that reduced: the transfer, without the
    waiting for slower ranks or for a CPU — what a fix to the communication could win back, at least."""

    node: str
    rank: int
    source: str  # measured (every timed step), ddp_samples (DDP's sampled averages, an estimate), collectives
    steps: int
    synced_steps: int  # steps that reduced gradients (not under no_sync)
    step_s: float
    exposed_s: float  # the rank's own exposed collective time, waiting for other ranks included
    comm_s: float
    share: float  # comm_s / step_s, %
    exposed_ms: float  # comm_s per synced step: the typical step's exposed time
    bytes_per_step: float | None
    total_ms: float | None  # the all-reduce per step, hidden part included (DDP's sampled average), where known
    hidden_pct: float | None  # of it, the share hidden behind backward (DDP's samples)
    bandwidth_gbps: float | None  # bytes per step / exposed time per step, Gb/s
    windows_above: int
    worst_window: dict[str, Any] | None  # share, first_step, last_step, start_us, end_us
    triggered: bool
    ddp: dict[str, Any] | None = None  # the DDP model's settings (bucket_cap_mb, gradient_as_bucket_view, …)
    fsdp: bool = False  # FSDP's all-gathers / reduce-scatters seen

    @property
    def wait_s(self) -> float:
        """Exposed time beyond the typical transfer: waiting for slower ranks, or for a CPU."""
        return max(self.exposed_s - self.comm_s, 0.0)

    @property
    def mean_exposed_ms(self) -> float:
        return 1000.0 * self.exposed_s / self.synced_steps if self.synced_steps else 0.0

    @property
    def key(self) -> str:
        return f"{self.node}/{self.rank}"


@dataclass(frozen=True)
class NodeComm:
    node: str
    ranks: list[int]
    share: float  # the largest of its ranks'
    comm_s: float
    link_gbps: float | None  # the fastest NIC's speed, where the kernel reports it
    nics: list[dict[str, Any]] = field(default_factory=list)
    triggered: bool = False


@dataclass(frozen=True)
class CommunicationDetails:
    """The rule's Details, typed: what the findings, the report's DDP paragraph and the dashboard read."""

    ranks: list[RankComm]
    nodes: list[NodeComm]
    threshold: float
    time_at_stake_s: float
    single_node: bool
    world_size: int | None
    title: str | None = None

    @property
    def fired(self) -> list[RankComm]:
        return [r for r in self.ranks if r.triggered]

    @property
    def top(self) -> RankComm | None:
        """The rank with the most communication time at stake (the one the paragraph and the finding name)."""
        pool = self.fired or self.ranks
        return max(pool, key=lambda r: (r.comm_s, r.share)) if pool else None

    def to_json(self) -> dict[str, Any]:
        fired = self.fired
        return {"ranks": {r.key: asdict(r) for r in self.ranks}, "nodes": {n.node: asdict(n) for n in self.nodes},
                "threshold": self.threshold, "time_at_stake_s": self.time_at_stake_s,
                "single_node": self.single_node, "world_size": self.world_size, "title": self.title,
                "ranks_fired": [r.key for r in fired], "nodes_fired": sorted({r.node for r in fired})}

    @classmethod
    def from_json(cls, details: Mapping[str, Any]) -> CommunicationDetails:
        """From a result's Details (this version's); raises KeyError/TypeError/ValueError on another shape."""
        ranks = [RankComm(**{k: v for k, v in e.items() if k in RankComm.__dataclass_fields__})
                 for e in (details.get("ranks") or {}).values()]
        nodes = [NodeComm(**{k: v for k, v in e.items() if k in NodeComm.__dataclass_fields__})
                 for e in (details.get("nodes") or {}).values()]
        return cls(ranks, nodes, float(details["threshold"]), float(details["time_at_stake_s"]),
                   bool(details.get("single_node")), details.get("world_size"), details.get("title"))


class _Rank:
    """Per window of step numbers (after patience): [steps, step µs, exposed µs, bytes, synced steps, first start,
    last end]; sums and extremes, so the order chunks come in does not matter."""

    def __init__(self) -> None:
        self.windows: dict[int, list[int]] = {}
        self.hist: dict[int, dict[int, int]] = {}  # window -> exposed µs bin -> steps
        self.per_step = False  # collectives recorded per step (measured, or the loop's own calls)
        self.ddp_measured = False
        self.fsdp = False

    def _row(self, k: int) -> list[int]:
        row = self.windows.get(k)
        if row is None:
            row = self.windows[k] = [0, 0, 0, 0, 0, 1 << 62, 0]
        return row

    def add_steps(self, w: np.ndarray, dur: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        uniq, inv = np.unique(w, return_inverse=True)
        counts = np.bincount(inv, minlength=len(uniq))
        sums = np.bincount(inv, weights=dur, minlength=len(uniq))
        lo, hi = np.full(len(uniq), np.iinfo(np.int64).max), np.full(len(uniq), np.iinfo(np.int64).min)
        np.minimum.at(lo, inv, start)
        np.maximum.at(hi, inv, end)
        for i, k in enumerate(uniq.tolist()):
            row = self._row(k)
            row[0] += int(counts[i])
            row[1] += int(sums[i])
            row[5], row[6] = min(row[5], int(lo[i])), max(row[6], int(hi[i]))

    def add_synced(self, w: np.ndarray, nbytes: np.ndarray, exposed: np.ndarray) -> None:
        """One entry per step that reduced: its window, bytes and exposed µs (into the window's histogram too)."""
        uniq, inv = np.unique(w, return_inverse=True)
        counts = np.bincount(inv, minlength=len(uniq))
        byte_sums = np.bincount(inv, weights=nbytes, minlength=len(uniq))
        exposed_sums = np.bincount(inv, weights=exposed, minlength=len(uniq))
        bins = _bin(exposed)
        for i, k in enumerate(uniq.tolist()):
            row = self._row(k)
            row[2] += int(exposed_sums[i])
            row[3] += int(byte_sums[i])
            row[4] += int(counts[i])
            hist = self.hist.setdefault(k, {})
            for b, c in zip(*np.unique(bins[inv == i], return_counts=True)):
                hist[int(b)] = hist.get(int(b), 0) + int(c)


BINS_PER_OCTAVE = 16  # exposed times kept per window as a histogram of log-spaced bins (≈ 4.4 % wide)
TYPICAL_QUANTILE = 0.25  # of a window's steps, the exposed time a step needs when the machine does not hold it up


def _bin(us: np.ndarray) -> np.ndarray:
    return np.floor(BINS_PER_OCTAVE * np.log2(np.maximum(us, 0) + 1.0)).astype(np.int64)


def _quantile(hist: Mapping[int, int], q: float) -> float:
    """The q-quantile of a histogram of `_bin`s (each bin's geometric middle), µs."""
    total = sum(hist.values())
    if not total:
        return 0.0
    target, seen = q * (total - 1), 0
    for b in sorted(hist):
        seen += hist[b]
        if seen > target:
            return float(2.0 ** ((b + 0.5) / BINS_PER_OCTAVE) - 1.0)
    return 0.0


class CommunicationBound(Rule):
    """Per node and rank, TRAIN steps after the first `patience`: the exposed collective time per step — measured on
    every timed step where the host sees it (DDP on the CPU; the loop's own torch.distributed calls), else DDP's
    sampled averages (its all-reduce less the part overlapping backward) — as a share of step time. Per window of
    `window` step numbers, only the least exposed time per step of any rank counts (the rest is waiting for a slower
    rank: Straggler's finding). A rank fires when that share over its steps exceeds `threshold` %.

    Evaluation points: each window of each rank. RuleTriggered = ranks that fire; Violations = their windows above
    the threshold; Datapoints = steps evaluated. Sums per window, so one chunk or many give the same result."""

    name = "CommunicationBound"
    metrics = ()  # framework events (and the node records' NICs)
    description = ("Measures how much of each training step waits for communication: the part of the gradient "
                   "all-reduce (and of other collectives) that is not hidden behind backward's computation, per "
                   "rank and over windows of steps, with the bytes reduced per step and the bandwidth that implies. "
                   "A step that waits for the network leaves the accelerator idle however fast it computes.")
    recommendation = ("Hide or shrink the communication: reduce gradients less often (gradient accumulation under "
                      "DDP's no_sync), in fewer and larger all-reduces or with smaller first buckets (bucket_cap_mb), "
                      "without the extra copy (gradient_as_bucket_view=True), compressed (an fp16/bf16 "
                      "communication hook), with more computation per step (a larger batch per rank), or over a "
                      "faster interconnect.")
    defaults = {"threshold": 20, "window": 100, "patience": 10}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        check_counts(self, "window", "patience")
        t = self.params["threshold"]
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t <= 100:
            raise ParameterError(f"{self.name}.threshold={t!r}: must be a percentage from 0 to 100")
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._samples: dict[tuple[str, int], tuple[int, int, dict]] = {}  # newest DDP sample: (start, count, args)
        self._config: dict[tuple[str, int], dict[str, Any]] = {}
        self._info: dict[str, dict[str, Any]] = {}
        self._events = 0

    # -- feeding -------------------------------------------------------------------------------------------
    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        for node, frame in chunk.system.items():
            if frame.info:
                self._info[node] = frame.info
        for node, rec in ((chunk.run or {}).get("nodes") or {}).items():
            if isinstance(rec, dict):
                self._info.setdefault(node, rec)
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        table = cols.table
        patience, window = int(self.params["patience"]), int(self.params["window"])
        train = cols.mode_is([TRAIN]) & (cols.step >= patience)

        def windows(rows: np.ndarray) -> np.ndarray:
            return (cols.step[rows] - patience) // window

        for (node, rank), rows in cols.groups(cols.kind_is(STEP) & train, by_mode=False):
            dur = np.maximum(cols.end[rows] - cols.start[rows], 0)
            self._rank(node, rank).add_steps(windows(rows), dur, cols.start[rows], cols.end[rows])
        collective = cols.kind_is(COLLECTIVE)
        if collective.any():
            names = _names(table, collective)
            sampled = collective & (names == DDP_EVENT)
            per_step = collective & ~sampled & train
            fsdp = collective & np.isin(names, FSDP_NAMES)
            for (node, rank), rows in cols.groups(per_step, by_mode=False):
                r = self._rank(node, rank)
                r.per_step = True
                r.ddp_measured |= bool((names[rows] == SYNC_EVENT).any())
                # per step number that reduced (one DDP event, or the loop's own calls): its bytes and exposed time
                rows = rows[np.argsort(cols.step[rows], kind="stable")]
                step = cols.step[rows]
                first = np.r_[True, step[1:] != step[:-1]]
                group = np.cumsum(first) - 1
                dur = np.maximum(cols.end[rows] - cols.start[rows], 0)
                r.add_synced(windows(rows[first]), np.bincount(group, weights=_bytes(table, rows)),
                             np.bincount(group, weights=dur))
            for (node, rank), rows in cols.groups(fsdp, by_mode=False):
                self._rank(node, rank).fsdp = True
            for i in np.flatnonzero(sampled).tolist():
                key = (cols.nodes[cols.node[i]], int(cols.rank[i]))
                args = _args(table, i)
                start = int(cols.start[i])
                known = self._samples.get(key)
                count = (known[1] if known else 0) + 1
                if known is None or start >= known[0]:
                    self._samples[key] = (start, count, args)
                else:
                    self._samples[key] = (known[0], count, known[2])
        config = cols.kind_is(CONFIG_KIND)
        for i in np.flatnonzero(config).tolist():
            self._config[(cols.nodes[cols.node[i]], int(cols.rank[i]))] = _args(table, i)

    def _rank(self, node: str, rank: int) -> _Rank:
        r = self._ranks.get((node, rank))
        if r is None:
            r = self._ranks[(node, rank)] = _Rank()
        return r

    def merge(self, other: Rule, node: str) -> None:
        """Fold in `other`, fed only `node`'s chunks: its ranks' windows, samples, settings and the node's record."""
        assert isinstance(other, CommunicationBound)
        self._events += other._events
        for key, r in other._ranks.items():
            if key[0] != node:
                continue
            mine = self._rank(*key)
            for k, row in r.windows.items():
                have = mine.windows.setdefault(k, [0, 0, 0, 0, 0, 1 << 62, 0])
                for j in range(5):
                    have[j] += row[j]
                have[5], have[6] = min(have[5], row[5]), max(have[6], row[6])
            for k, hist in r.hist.items():
                have_hist = mine.hist.setdefault(k, {})
                for b, c in hist.items():
                    have_hist[b] = have_hist.get(b, 0) + c
            mine.per_step |= r.per_step
            mine.ddp_measured |= r.ddp_measured
            mine.fsdp |= r.fsdp
        for key, s in other._samples.items():
            if key[0] == node:
                known = self._samples.get(key)
                count = s[1] + (known[1] if known else 0)
                newest = s if known is None or s[0] >= known[0] else known
                self._samples[key] = (newest[0], count, newest[2])
        self._config.update((k, v) for k, v in other._config.items() if k[0] == node)
        if node in other._info:
            self._info[node] = other._info[node]

    # -- judging -------------------------------------------------------------------------------------------
    def result(self) -> RuleResult:
        if self._events == 0:
            return self.not_applicable("no framework data: the job recorded no steps (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        series = self._series()
        series = {k: v for k, v in series.items() if any(x is not None for x in v[2].values())}
        if not series:
            return self.not_applicable("no collective was recorded in the training steps: a single-process job has "
                                       "none (DistributedDataParallel's gradient all-reduce, and the loop's own "
                                       "torch.distributed calls, are what this rule reads)")
        threshold = float(self.params["threshold"])
        # per window, the least typical exposed time per step of any rank: the transfer, not waiting for a slower
        # rank (or for a CPU: the lower quartile of the window's steps)
        least: dict[int, float] = {}
        for _, _, per_step in series.values():
            for k, v in per_step.items():
                if v is not None:
                    least[k] = min(least.get(k, v), v)
        nodes_of = sorted({n for n, _ in self._ranks})
        world = self._world_size(series)
        ranks: list[RankComm] = []
        datapoints = 0
        for (node, rank), (source, r, per_step) in sorted(series.items()):
            entry = self._entry(node, rank, source, r, per_step, least, threshold)
            datapoints += entry.steps
            ranks.append(entry)
        fired = [e for e in ranks if e.triggered]
        stake = max((e.comm_s for e in fired), default=0.0)  # ranks wait side by side: the worst one's is the job's
        nodes = []
        for node in nodes_of:
            mine = [e for e in ranks if e.node == node]
            if not mine:
                continue
            nics = [n for n in (self._info.get(node) or {}).get("nics") or [] if isinstance(n, dict)]
            speeds = [float(v) for v in (n.get("speed_mbps") for n in nics) if isinstance(v, (int, float))]
            nodes.append(NodeComm(node, [e.rank for e in mine], max(e.share for e in mine),
                                  max(e.comm_s for e in mine), max(speeds) / 1000.0 if speeds else None, nics,
                                  any(e.triggered for e in mine)))
        title = None
        if fired:
            top = max(fired, key=lambda e: e.comm_s)
            what = "the gradient all-reduce" if top.source != CALLS else "collectives"
            title = (f"Training waits for {what} {top.share:.0f} % of the time on rank {top.key}" if len(fired) == 1
                     else f"Training waits for {what} up to {top.share:.0f} % of the time on {len(fired)} ranks")
        details = CommunicationDetails(ranks, nodes, threshold, stake, len(nodes_of) == 1, world, title)
        out = details.to_json()
        out["steps"] = []
        return self.make_result(triggered=len(fired), violations=sum(e.windows_above for e in fired),
                                datapoints=datapoints, details=out,
                                recommendation=advice(details) if fired else None)

    def _series(self) -> dict[tuple[str, int], tuple[str, _Rank, dict[int, float | None]]]:
        """Per rank with steps and a source: (source, windows, exposed µs per step per window)."""
        out = {}
        for key, r in self._ranks.items():
            if r.per_step:
                source = MEASURED if r.ddp_measured else CALLS
                per_step = {k: _quantile(r.hist[k], TYPICAL_QUANTILE) if row[4] > 0 and r.hist.get(k) else None
                            for k, row in r.windows.items() if row[0] > 0}
            else:
                sample = self._sample(key)
                if sample is None:
                    continue
                comm, overlap, _ = sample
                source = SAMPLED
                per_step = {k: (comm - overlap) * 1000.0 for k, row in r.windows.items() if row[0] > 0}
            if per_step:
                out[key] = (source, r, per_step)
        return out

    def _sample(self, key: tuple[str, int]) -> tuple[float, float, float] | None:
        known = self._samples.get(key)
        return averages(known[2]) if known else None

    def _world_size(self, series: Mapping[tuple[str, int], Any]) -> int | None:
        sizes = [v for v in (c.get("world_size") for c in self._config.values()) if isinstance(v, int)]
        return max(sizes) if sizes else (len(series) if len(series) > 1 else None)

    def _entry(self, node: str, rank: int, source: str, r: _Rank, per_step: dict[int, float | None],
               least: dict[int, float], threshold: float) -> RankComm:
        steps = step_us = exposed = comm = nbytes = synced = 0.0
        above = 0
        worst: dict[str, Any] | None = None
        for k in sorted(per_step):
            n, dur, exp, b, s, first, last = r.windows[k]
            if n == 0:
                continue
            reduced = s if source != SAMPLED else n  # steps that reduced (DDP's samples: every one)
            mine = least.get(k, 0.0) * reduced if per_step[k] is not None else 0.0
            steps, step_us, comm = steps + n, step_us + dur, comm + mine
            exposed += exp if source != SAMPLED else (per_step[k] or 0.0) * n
            nbytes, synced = nbytes + b, synced + reduced
            share = 100.0 * mine / dur if dur else 0.0
            above += share > threshold
            if worst is None or share > worst["share"]:
                patience, window = int(self.params["patience"]), int(self.params["window"])
                worst = {"share": share, "first_step": patience + k * window,
                         "last_step": patience + (k + 1) * window - 1, "start_us": first, "end_us": last}
        config = self._config.get((node, rank))
        if source == SAMPLED and config and isinstance(config.get("bytes"), (int, float)):
            nbytes = float(config["bytes"]) * synced
        sample = self._sample((node, rank))
        share = 100.0 * comm / step_us if step_us else 0.0
        per_sync_ms = comm / synced / 1000.0 if synced else 0.0
        bytes_per_step = nbytes / synced if synced and nbytes else None
        bandwidth = (bytes_per_step * 8 / (per_sync_ms / 1000.0) / 1e9 if bytes_per_step and per_sync_ms > 0
                     else None)
        triggered = steps >= MIN_STEPS and share > threshold
        return RankComm(node=node, rank=rank, source=source, steps=int(steps), synced_steps=int(synced),
                        step_s=step_us / US, exposed_s=exposed / US, comm_s=comm / US, share=share,
                        exposed_ms=per_sync_ms, bytes_per_step=bytes_per_step,
                        total_ms=sample[0] if sample else None,
                        hidden_pct=100.0 * sample[1] / sample[0] if sample and sample[0] > 0 else None,
                        bandwidth_gbps=bandwidth, windows_above=int(above) if triggered else 0, worst_window=worst,
                        triggered=bool(triggered), ddp=config, fsdp=r.fsdp)


def advice(d: CommunicationDetails) -> str:
    """What to change, in the job's own settings, for the rank with the most at stake."""
    top = d.top
    if top is None:
        return ""
    mb = f"{top.bytes_per_step / 1e6:,.1f} MB" if top.bytes_per_step else "its gradients"
    bw = f" ({top.bandwidth_gbps:,.2f} Gb/s effective)" if top.bandwidth_gbps else ""
    head = (f"Rank {top.key} typically waited {top.exposed_ms:,.1f} ms a step ({top.share:.0f} % of its step time, "
            f"{top.comm_s:,.1f} s in all; {top.mean_exposed_ms:,.1f} ms on average) for the all-reduce of {mb} after "
            f"backward's computation ended{bw}")
    if top.total_ms is not None and top.hidden_pct is not None:
        head += f"; DDP's own timing: {top.total_ms:,.1f} ms of all-reduce a step, {top.hidden_pct:.0f} % of it hidden"
    tips = []
    cfg = top.ddp or {}
    tips.append("reduce less often: accumulate gradients over several micro-batches inside `with model.no_sync():` "
                "and let only the last backward reduce (the same bytes for k times the samples), or raise the batch "
                "per rank so that more computation hides each all-reduce")
    cap = cfg.get("bucket_cap_mb")
    if isinstance(cap, (int, float)):
        tips.append(f"tune `bucket_cap_mb` (now {cap:g}): fewer, larger buckets cost fewer all-reduce calls "
                    "(latency-bound: small messages, low effective bandwidth); smaller ones start reducing earlier "
                    "in backward, so more of it overlaps the computation")
    if cfg.get("gradient_as_bucket_view") is False:
        tips.append("pass `gradient_as_bucket_view=True` to DistributedDataParallel: the reduced buckets become the "
                    "gradients, without a copy of every gradient after the all-reduce")
    if cfg.get("find_unused_parameters"):
        tips.append("drop `find_unused_parameters=True` if every parameter is used (it adds a pass over the graph and "
                    "an extra all-reduce each step), or use `static_graph=True`")
    tips.append("compress what is sent: `model.register_comm_hook(None, torch.distributed.algorithms.ddp_comm_hooks."
                "default_hooks.bf16_compress_hook)` halves the bytes")
    if top.fsdp:
        tips.append("with FSDP: keep the all-gathers of a step within a node (`ShardingStrategy.HYBRID_SHARD`), "
                    "prefetch them (`backward_prefetch=BACKWARD_PRE`, `forward_prefetch=True`) or shard less "
                    "(`SHARD_GRAD_OP`)")
    else:
        tips.append("for a model this large against its computation, ZeRO (`ZeroRedundancyOptimizer`) or FSDP "
                    "shards the optimizer's work but not the bytes: it helps memory more than communication")
    link = _link(d, top)
    tips.append(link)
    return f"{head}. Try: " + "; ".join(tips) + "."


def _link(d: CommunicationDetails, top: RankComm) -> str:
    node = next((n for n in d.nodes if n.node == top.node), None)
    if d.single_node:
        return ("the ranks share one machine, so the all-reduce does not cross a network: on GPUs, NCCL over "
                "NVLink/PCIe instead of gloo; on CPUs, fewer ranks per machine with more threads each")
    if node is not None and node.link_gbps and top.bandwidth_gbps:
        used = 100.0 * top.bandwidth_gbps / node.link_gbps
        if used >= 50:
            return (f"the effective {top.bandwidth_gbps:,.1f} Gb/s is {used:.0f} % of node {node.node}'s "
                    f"{node.link_gbps:,.0f} Gb/s link: the interconnect is the limit (a faster network, RDMA/EFA, "
                    "or fewer bytes)")
        return (f"the effective {top.bandwidth_gbps:,.1f} Gb/s is only {used:.0f} % of node {node.node}'s "
                f"{node.link_gbps:,.0f} Gb/s link: latency or small messages, not bandwidth, cost the time "
                "(larger buckets, fewer calls)")
    return "the node's link speed could not be read: compare the effective bandwidth with the interconnect's"


def _names(table: pa.Table, mask: np.ndarray) -> np.ndarray:
    """The events' names where `mask` (else "")."""
    out = np.full(table.num_rows, "", dtype=object)
    idx = np.flatnonzero(mask)
    if idx.size:
        out[idx] = np.asarray(table["name"].take(pa.array(idx)).cast(pa.string()).to_pylist(), dtype=object)
    return out


def _bytes(table: pa.Table, rows: np.ndarray) -> np.ndarray:
    """Each event's `bytes` (args), 0 where not said; each distinct args text parsed once."""
    seen: dict[Any, float] = {}
    out = np.zeros(len(rows))
    for i, text in enumerate(table["args"].take(pa.array(rows)).to_pylist()):
        b = seen.get(text)
        if b is None:
            value = _parse(text).get("bytes")
            b = seen[text] = (float(value) if isinstance(value, (int, float)) and not isinstance(value, bool)
                              and value >= 0 else 0.0)
        out[i] = b
    return out


def _args(table: pa.Table, i: int) -> dict[str, Any]:
    return _parse(table["args"][i].as_py())


def _parse(text: Any) -> dict[str, Any]:
    try:
        args = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return args if isinstance(args, dict) else {}


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    d = CommunicationDetails.from_json(r.details)
    top = d.top
    if not r.fired or top is None:
        return []
    fired = d.fired
    windows = sorted((int(e.worst_window["start_us"]), int(e.worst_window["end_us"])) for e in fired
                     if isinstance(e.worst_window, dict))
    evidence = {e.key: {"share": e.share, "exposed_ms_per_step": e.exposed_ms, "exposed_s": e.comm_s,
                        "mean_exposed_ms_per_step": e.mean_exposed_ms, "held_up_s": e.wait_s,
                        "bytes_per_step": e.bytes_per_step,
                        "all_reduce_ms_per_step": e.total_ms, "hidden_pct": e.hidden_pct,
                        "bandwidth_gbps": e.bandwidth_gbps, "source": e.source} for e in fired[:16]}
    evidence["link_gbps"] = {n.node: n.link_gbps for n in d.nodes}
    return [finding(r, s, "comm", d.title or "Training waits for communication", over_all_steps(d.time_at_stake_s, s),
                    Where(sorted({e.node for e in fired}), [e.key for e in fired], [], windows[:LISTED_WINDOWS]),
                    evidence)]
