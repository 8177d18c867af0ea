"""CPUContention: the training thread was ready to run but waited for a CPU. Each step records that wait (its
run-queue delay, analyze/contention.py); the sampler says why — other processes on an oversubscribed node, the
container's CPU limit (CFS throttling), a hypervisor's steal, or the job's own threads and workers on too few
cores. InputBound and StepOutlier judge the steps' own time, so this rule is the one that names the wait."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stallwatch.analyze.contention import runq_column, step_runq
from stallwatch.analyze.finding import Finding, Where, finding, over_all_steps
from stallwatch.analyze.framework_frame import new_events, rank_key
from stallwatch.analyze.rules.base import Chunk, ParameterError, Rule, RuleResult
from stallwatch.analyze.summary import JobSummary
from stallwatch.records import (
    CGROUP,
    CPU,
    CPU_QUOTA_CORES,
    CPU_STEAL,
    CPU_THROTTLED,
    CPU_THROTTLED_S,
    CPU_UTIL,
    LOAD_1,
    NVCSW_PER_S,
    PROC,
    RUNQ_MS_PER_S,
    STEP,
    UNTIMED,
    WORKERS_RUNQ_MS_PER_S,
)

US = 1_000_000
LIMIT, OVERSUBSCRIBED, STEAL, OWN = "cpu_limit", "oversubscribed", "steal", "own_threads"
STEAL_PCT = 5.0  # mean steal (% of the node's CPU) that names the hypervisor
OTHERS_PCT = 10.0  # mean CPU of processes outside the job (% of the node) that names them
MAX_NAMED_PROCESSES = 5


@dataclass(frozen=True)
class RankWait:
    """One rank's training thread: its steps, their time, and how much of it was spent waiting for a CPU."""

    node: str
    rank: int
    steps: int
    step_s: float
    runq_s: float
    share: float  # % of step time
    triggered: bool


@dataclass(frozen=True)
class NodeCPU:
    """What the sampler saw of a node's CPUs while the job ran (means over its snapshots)."""

    node: str
    cores: int | None
    load_mean: float | None
    load_max: float | None
    steal_pct: float | None
    others_cpu_pct: float | None  # CPU used by processes outside the job, % of the node
    job_runq_ms_per_s: float | None  # the job's processes' main threads, summed
    workers_runq_ms_per_s: float | None
    involuntary_switches_per_s: float | None
    throttled_periods: int
    throttled_s: float
    quota_cores: float | None
    competitors: list[dict[str, Any]] = field(default_factory=list)  # [{pid, name, cpu_s}]
    causes: list[str] = field(default_factory=list)  # most telling first


@dataclass(frozen=True)
class CPUContentionDetails:
    """The rule's Details: per rank (`node/rank`) and per node, the run's time at stake and what to say."""

    ranks: dict[str, RankWait]
    nodes: dict[str, NodeCPU]
    threshold: float
    time_at_stake_s: float
    ranks_fired: list[str]
    nodes_fired: list[str]
    cause: str | None
    title: str | None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["nodes_with_contention"] = out.pop("nodes_fired")
        return out

    @staticmethod
    def from_json(d: dict[str, Any]) -> CPUContentionDetails:
        """The Details of a result (raises KeyError/TypeError on another shape: the findings fall back)."""
        return CPUContentionDetails(
            ranks={k: RankWait(**v) for k, v in d["ranks"].items()},
            nodes={k: NodeCPU(**v) for k, v in d["nodes"].items()},
            threshold=float(d["threshold"]), time_at_stake_s=float(d["time_at_stake_s"]),
            ranks_fired=[str(x) for x in d["ranks_fired"]], nodes_fired=[str(x) for x in d["nodes_with_contention"]],
            cause=d.get("cause"), title=d.get("title"))


class _NodeSums:
    """A node's snapshots summed as they come (NaN-free sums and counts)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.max_load = -math.inf
        self.quota: float | None = None
        self.info: dict[str, Any] = {}

    def add(self, key: str, values: np.ndarray | None) -> None:
        if values is None:
            return
        ok = values[~np.isnan(values)]
        if ok.size:
            self.sums[key] = self.sums.get(key, 0.0) + float(ok.astype(np.float64).sum())
            self.counts[key] = self.counts.get(key, 0) + int(ok.size)

    def merge(self, other: _NodeSums) -> None:
        for key, value in other.sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.counts[key] = self.counts.get(key, 0) + other.counts[key]
        self.max_load = max(self.max_load, other.max_load)
        self.quota = other.quota if other.quota is not None else self.quota
        self.info = {**self.info, **other.info}

    def mean(self, key: str) -> float | None:
        """Rounded to 6 places: the same whatever order the snapshots were summed in (one chunk or many)."""
        n = self.counts.get(key, 0)
        return round(self.sums[key] / n, 6) if n else None


class CPUContention(Rule):
    """Per node and rank: the share of step time the training thread spent runnable but waiting for a CPU (its
    run-queue delay, recorded with each step). A rank fires when that share exceeds `threshold` % and the wait
    adds up to at least `min_s` seconds over all its steps (where steps are sampled, the timed steps' wait scaled
    by the time of the steps counted beside them). The node's snapshots say why: CFS throttling by the cgroup's CPU limit,
    processes outside the job using the CPUs (load against cores, which ones), steal, or else the job's own
    threads and workers.

    Evaluation points: each rank. RuleTriggered = ranks that fire; Violations = the same; Datapoints = steps.
    Sums are exact per rank (µs) and per node (snapshot means rounded to 6 places), so one chunk or many give the
    same result."""

    name = "CPUContention"
    metrics = (CPU_UTIL, CPU_STEAL, LOAD_1, CPU_THROTTLED, CPU_THROTTLED_S, CPU_QUOTA_CORES, RUNQ_MS_PER_S,
               WORKERS_RUNQ_MS_PER_S, NVCSW_PER_S)
    description = ("Measures how long the training thread was ready to run but waited for a CPU, per rank: time "
                   "taken by other processes on the node, a container's CPU limit (throttling) or a hypervisor "
                   "(steal). That time lands in whatever phase it interrupts; it is neither data loading nor the "
                   "job's own work.")
    recommendation = ("Give the training thread a CPU of its own: fewer processes on the node, a higher CPU limit, "
                      "fewer data-loader workers and intra-op threads than the cores it has.")
    defaults = {"threshold": 10.0, "min_s": 0.5}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        for key, top in (("threshold", 100.0), ("min_s", 1e9)):
            v = self.params[key]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not 0 <= v <= top:
                raise ParameterError(f"{self.name}.{key}={v!r}: must be a number from 0 to {top:g}")
        self._ranks: dict[tuple[str, int], list[int]] = {}  # steps, step µs, run-queue µs, steps with a reading
        self._nodes: dict[str, _NodeSums] = {}
        self._events = 0

    @classmethod
    def findings(cls, result: RuleResult, summary: JobSummary) -> list[Finding]:
        """This rule's result as findings (analyze/finding.py), read through its typed Details."""
        return findings_of(result, summary)

    def update(self, chunk: Chunk) -> None:
        for node, frame in chunk.system.items():
            sums = self._nodes.setdefault(node, _NodeSums())
            if frame.info:
                sums.info = frame.info
            if not len(frame):
                continue
            for key, device, metric in (("cpu", CPU, CPU_UTIL), ("proc", PROC, CPU_UTIL), ("steal", CPU, CPU_STEAL),
                                        ("load", CPU, LOAD_1), ("throttled", CGROUP, CPU_THROTTLED),
                                        ("throttled_s", CGROUP, CPU_THROTTLED_S), ("runq", PROC, RUNQ_MS_PER_S),
                                        ("workers_runq", PROC, WORKERS_RUNQ_MS_PER_S), ("nvcsw", PROC, NVCSW_PER_S)):
                sums.add(key, frame.get(device, metric))
            load = frame.get(CPU, LOAD_1)
            if load is not None and (~np.isnan(load)).any():
                sums.max_load = max(sums.max_load, float(np.nanmax(load)))
            quota = frame.get(CGROUP, CPU_QUOTA_CORES)
            if quota is not None and (~np.isnan(quota)).any():
                sums.quota = float(quota[~np.isnan(quota)][-1])
        for node, rec in ((chunk.run or {}).get("nodes") or {}).items():
            if isinstance(rec, dict):
                sums = self._nodes.setdefault(node, _NodeSums())
                sums.info = {**rec, **sums.info} if sums.info else dict(rec)
        cols = new_events(chunk)
        if cols is None:
            return
        self._events += cols.n
        for (node, rank), rows in cols.groups(cols.kind_is(STEP) & (cols.step >= 0), by_mode=False):
            runq = step_runq(cols, rows)
            acc = self._ranks.setdefault((node, rank), [0, 0, 0, 0, 0, 0])
            acc[0] += len(rows)
            acc[1] += int(np.maximum(cols.end[rows] - cols.start[rows], 0).sum())
            acc[2] += int(runq.sum())
            acc[3] += int(np.count_nonzero(runq))
            acc[5] += int(np.count_nonzero(runq_column(cols, missing=-1)[rows] >= 0))  # measured, 0 included
        # steps counted, not timed (a fast loop's sampling): their span, so that `min_s` holds over all steps
        for (node, rank), rows in cols.groups(cols.kind_is(UNTIMED), by_mode=False):
            acc = self._ranks.setdefault((node, rank), [0, 0, 0, 0, 0, 0])
            acc[4] += int(np.maximum(cols.end[rows] - cols.start[rows], 0).sum())

    def merge(self, other: Rule, node: str) -> None:
        """Fold in `other`, fed only `node`'s chunks: its sums for `node` (every figure is a sum per node or rank)."""
        assert isinstance(other, CPUContention)
        self._events += other._events
        for key, acc in other._ranks.items():
            if key[0] == node:
                mine = self._ranks.setdefault(key, [0, 0, 0, 0, 0, 0])
                for i, v in enumerate(acc):
                    mine[i] += v
        if node in other._nodes:
            self._nodes.setdefault(node, _NodeSums()).merge(other._nodes[node])

    def result(self) -> RuleResult:
        if self._events == 0 or not self._ranks:
            return self.not_applicable("no framework data: the job recorded no steps (was it run under "
                                       "`stallwatch run` with PyTorch?)")
        if not any(acc[3] or acc[5] for acc in self._ranks.values()):
            return self.not_applicable("the steps do not record the training thread's run-queue delay (a run "
                                       "recorded before it was measured, or a system without schedstats)")
        threshold, min_s = float(self.params["threshold"]), float(self.params["min_s"])
        ranks: dict[str, RankWait] = {}
        for (node, rank), (n, step_us, runq_us, _, untimed_us, _) in sorted(self._ranks.items()):
            share = 100.0 * runq_us / step_us if step_us else 0.0
            whole_us = runq_us * (step_us + untimed_us) / step_us if step_us else 0.0  # over all steps, sampled too
            fires = share > threshold and whole_us / US >= min_s
            ranks[rank_key(node, rank)] = RankWait(node, rank, n, step_us / US, runq_us / US, share, fires)
        fired = [k for k, w in ranks.items() if w.triggered]
        fired_nodes = sorted({ranks[k].node for k in fired})
        nodes = {node: self._node(node, node in fired_nodes) for node in sorted({w.node for w in ranks.values()})}
        stake = max((ranks[k].runq_s for k in fired), default=0.0)  # ranks wait side by side: the worst one's
        cause = title = None
        if fired:
            top = max((ranks[k] for k in fired), key=lambda w: w.share)
            causes = nodes[top.node].causes
            cause = causes[0] if causes else OWN
            title = _title(top, nodes[top.node], cause, len(fired))
        details = CPUContentionDetails(ranks, nodes, threshold, stake, fired, fired_nodes, cause, title)
        return self.make_result(triggered=len(fired), violations=len(fired),
                                datapoints=sum(w.steps for w in ranks.values()), details=details.to_json(),
                                recommendation=_advice(details) if fired else None)

    def _node(self, node: str, fired: bool) -> NodeCPU:
        s = self._nodes.get(node) or _NodeSums()
        cores = s.info.get("cpu_cores_logical")
        cores = int(cores) if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0 else None
        cpu, proc = s.mean("cpu"), s.mean("proc")
        others = max(cpu - proc, 0.0) if cpu is not None and proc is not None else None
        competitors = [c for c in s.info.get("cpu_competitors") or [] if isinstance(c, dict)][:MAX_NAMED_PROCESSES]
        throttled = int(round(s.sums.get("throttled", 0.0)))
        throttled_s = round(s.sums.get("throttled_s", 0.0), 6)
        load = s.mean("load")
        steal = s.mean("steal")
        causes = []
        if fired:
            if throttled > 0 and throttled_s > 0:
                causes.append(LIMIT)
            # the load counts the job's own threads too: other processes are named by the CPU they used
            if others >= OTHERS_PCT if others is not None else (load is not None and cores and load > cores):
                causes.append(OVERSUBSCRIBED)
            if steal is not None and steal >= STEAL_PCT:
                causes.append(STEAL)
            if not causes:
                causes.append(OWN)
        return NodeCPU(node, cores, load, s.max_load if math.isfinite(s.max_load) else None, steal, others,
                       s.mean("runq"), s.mean("workers_runq"), s.mean("nvcsw"), throttled, throttled_s, s.quota,
                       competitors, causes)


def _procs(n: NodeCPU) -> str:
    named = [f"{c.get('name')} (pid {c.get('pid')}, {float(c.get('cpu_s') or 0):.1f} s of CPU)" for c in n.competitors]
    return ", ".join(named[:3])


def _title(top: RankWait, n: NodeCPU, cause: str, fired: int) -> str:
    where = f"rank {top.node}/{top.rank}" if fired == 1 else f"{fired} ranks"
    head = f"The training thread waited for a CPU {top.share:.0f} % of its step time on {where}"
    if cause == LIMIT:
        return f"{head}: the container's CPU limit throttled it {n.throttled_periods} times ({n.throttled_s:.1f} s)"
    if cause == OVERSUBSCRIBED:
        load = f"load {n.load_mean:.1f} on {n.cores} cores" if n.load_mean is not None and n.cores else "a busy node"
        return f"{head}: other processes share its cores ({load})"
    if cause == STEAL:
        return f"{head}: the hypervisor took {n.steal_pct:.0f} % of the CPU (steal)"
    return f"{head}: the job's own processes and threads outnumber its cores"


def _advice(d: CPUContentionDetails) -> str:
    lines = []
    for node in d.nodes_fired[:8]:
        n = d.nodes[node]
        waits = [w for w in d.ranks.values() if w.node == node and w.triggered]
        waited = max(w.runq_s for w in waits)
        head = (f"On node {node}, the training thread of {len(waits)} rank(s) waited {waited:.1f} s "
                f"for a CPU (up to {max(w.share for w in waits):.0f} % of step time)")
        parts = []
        for cause in n.causes:
            if cause == LIMIT:
                quota = f"{n.quota_cores:g} cores" if n.quota_cores is not None else "its quota"
                parts.append(f"the cgroup's CPU limit ({quota}) throttled the job {n.throttled_periods} times, "
                             f"{n.throttled_s:.1f} s in all: raise the limit (Kubernetes resources.limits.cpu, "
                             "docker --cpus), or use fewer data-loader workers and intra-op threads than the quota "
                             "(torch.set_num_threads)")
            elif cause == OVERSUBSCRIBED:
                load = (f"load {n.load_mean:.1f} (max {n.load_max:.1f}) on {n.cores} cores"
                        if n.load_mean is not None and n.load_max is not None and n.cores else "a busy node")
                who = _procs(n)
                parts.append(f"other processes used {n.others_cpu_pct or 0:.0f} % of the node's CPU ({load}"
                             f"{'; ' + who if who else ''}): run the job where it has its cores to itself, or pin "
                             "it (taskset, cpuset, os.sched_setaffinity) to cores the others do not use")
            elif cause == STEAL:
                parts.append(f"the hypervisor took {n.steal_pct:.0f} % of the node's CPU (steal): a VM on an "
                             "oversubscribed host; a dedicated or larger instance gives the cycles back")
            else:
                parts.append("the job's own processes and threads outnumber the cores: fewer data-loader workers "
                             "than free cores, torch.set_num_threads(cores per rank), and pin threads to cores")
        lines.append(f"{head}: " + "; ".join(parts) + ".")
    lines.append("This time is not counted as data loading or slow steps (InputBound, StepOutlier judge the "
                 "steps' own time).")
    return " ".join(lines)


def findings_of(r: RuleResult, s: JobSummary) -> list[Finding]:
    if not r.fired:
        return []
    d = CPUContentionDetails.from_json(r.details)
    evidence = {key: {"runq_s": w.runq_s, "share": w.share, "steps": w.steps} for key, w in d.ranks.items()
                if w.triggered}
    for node in d.nodes_fired[:16]:
        n = d.nodes[node]
        evidence[node] = {"causes": n.causes, "load": n.load_mean, "cores": n.cores, "steal_pct": n.steal_pct,
                          "others_cpu_pct": n.others_cpu_pct, "throttled_periods": n.throttled_periods,
                          "throttled_s": n.throttled_s, "quota_cores": n.quota_cores,
                          "processes": n.competitors[:3]}
    return [finding(r, s, "cpu", d.title or "The training thread waits for a CPU",
                    over_all_steps(d.time_at_stake_s, s), Where(d.nodes_fired, d.ranks_fired), evidence)]
