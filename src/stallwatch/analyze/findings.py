"""What to fix first: the rules' results turned into findings — one per problem found, with its evidence
(numbers, nodes, ranks, steps, time windows), the training time at stake and the change to try — ranked by
that time, and one verdict line that agrees with the first finding and with the job's fate. What the top of the
report, the terminal summary, `findings.json`, the notebook and the dashboard show (RULES.md, "Findings")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.contention import CPUContentionDetails
from stallwatch.analyze.rules.dataloader import PIN_MEMORY_ADVICE
from stallwatch.analyze.summary import JobFate, JobSummary
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, OPTIMIZER
from stallwatch.timeutil import format_duration

HIGH, MEDIUM, LOW = "high", "medium", "low"
SEVERITIES = (HIGH, MEDIUM, LOW)
HIGH_SHARE, MEDIUM_SHARE = 0.20, 0.05  # of the training loop's time at stake
MACHINE_RULES = ("CPUContention",)  # findings about what the machine did to the job: a healthy job can have them
LISTED_STEPS = 20
LISTED_WINDOWS = 20


@dataclass(frozen=True)
class Where:
    """Where a finding was seen: nodes, ranks ("node/rank"), step numbers and time windows (µs)."""
    nodes: list[str] = field(default_factory=list)
    ranks: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    windows: list[tuple[int, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "ranks": list(self.ranks), "steps": list(self.steps),
                "windows": [list(w) for w in self.windows]}


@dataclass(frozen=True)
class Finding:
    id: str
    rule: str
    severity: str
    title: str
    time_at_stake_s: float | None  # training time a fix could recover (an estimate); None where not a time
    share_of_loop: float | None  # time at stake / training loop
    where: Where
    evidence: dict[str, Any]
    recommendation: str
    share_of: str = "loop"  # what share_of_loop is a share of: "loop", or "job" for time outside the loop

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "rule": self.rule, "severity": self.severity, "title": self.title,
                "time_at_stake_s": _round(self.time_at_stake_s), "share_of_loop": _round(self.share_of_loop, 4),
                "share_of": self.share_of,
                "where": self.where.to_json(), "evidence": self.evidence, "recommendation": self.recommendation}


@dataclass(frozen=True)
class Findings:
    """The run's findings, most training time at stake first, and its one-line verdict."""
    run: str
    fate: JobFate
    verdict: str
    healthy: bool
    findings: list[Finding]
    loop_s: float
    evidence: list[str] = field(default_factory=list)  # why a healthy run is called healthy
    notes: list[str] = field(default_factory=list)  # caveats about the measurements themselves
    steps: dict[str, int] = field(default_factory=dict)  # per mode, all ranks (what `stallwatch ls` shows)

    def to_json(self) -> dict[str, Any]:
        fate = {"code": self.fate.code, "signal": self.fate.signal, "interrupted": self.fate.interrupted,
                "state": self.fate.state, "stop_reason": self.fate.stop_reason, "node": self.fate.node}
        return {"run": self.run, "fate": fate, "exit": dict(fate),  # exit: fate's old name, kept one release
                "verdict": self.verdict, "healthy": self.healthy, "training_loop_s": _round(self.loop_s),
                "steps": dict(self.steps),
                "evidence": list(self.evidence), "notes": list(self.notes),
                "findings": [f.to_json() for f in self.findings]}


# -- per-rule translation ------------------------------------------------------------------------------------

Translator = Callable[[RuleResult, JobSummary], list[Finding]]
_TRANSLATORS: dict[str, Translator] = {}


def translates(*names: str) -> Callable[[Translator], Translator]:
    def register(fn: Translator) -> Translator:
        for name in names:
            _TRANSLATORS[name] = fn
        return fn
    return register


def share_text(share: float | None, of: str = "loop") -> str | None:
    """A finding's share of the loop (or of the job, for time outside the loop) in words; a stake longer than
    the loop (system windows that include the start-up) is said so instead of "127 %"."""
    if share is None:
        return None
    return f"{100 * share:.0f} % of the {of}" if share <= 1.0 else f"more than the {of}: time outside it counts"


def finding(result: RuleResult, summary: JobSummary, key: str, title: str, stake_s: float | None, where: Where,
            evidence: dict[str, Any], recommendation: str | None = None, severity: str | None = None) -> Finding:
    loop = summary.loop_s
    share = stake_s / loop if stake_s is not None and loop > 0 else None
    if severity is None:
        severity = LOW if share is None else HIGH if share >= HIGH_SHARE else MEDIUM if share >= MEDIUM_SHARE else LOW
    return Finding(f"{_slug(result.name)}/{key}", result.name, severity, title, stake_s, share, where,
                   _plain(evidence), recommendation or result.recommendation)


@translates("CPUBottleneck", "IOBottleneck")
def _bottleneck(r: RuleResult, s: JobSummary) -> list[Finding]:
    what = "CPU" if r.name == "CPUBottleneck" else "I/O"
    ranges = (r.details.get("bottlenecks") or {}).get("ranges") or []
    out = []
    for node, e in sorted((r.details.get("nodes") or {}).items()):
        if not isinstance(e, dict) or not e.get("above_threshold"):
            continue
        count = int(e.get("bottlenecks") or 0)
        held = e.get("bottleneck_s")  # the snapshots' own intervals; a result of an older version has none
        stake = (float(held) if isinstance(held, (int, float)) and not isinstance(held, bool)
                 else count * s.sample_interval_ms.get(node, 0.0) / 1000.0) or None
        windows = [(int(x["start_us"]), int(x["end_us"])) for x in ranges if x.get("node") == node]
        out.append(finding(r, s, node,
                           f"GPUs idle while the {what} was the bottleneck {_pct(e.get('percent'))} of the time "
                           f"on node {node}", stake, Where([node], windows=windows[:LISTED_WINDOWS]),
                           {"bottleneck_snapshots": count, "snapshots": e.get("datapoints"),
                            "percent": e.get("percent"), "threshold_percent": r.parameters.get("threshold")}))
    return out


@translates("StepOutlier")
def _outliers(r: RuleResult, s: JobSummary) -> list[Finding]:
    out = []
    series = r.details.get("step_details") or {}
    fired = [(k, e) for k, e in series.items() if isinstance(e, dict) and e.get("triggered")]
    if not fired:
        return out
    per_rank: dict[str, float] = {}
    steps: list[int] = []
    windows: list[tuple[int, int]] = []
    count = 0
    for key, e in fired:
        stats = e.get("step_stats") or {}
        p50 = float(stats.get("p50") or 0.0)
        durations = [float(d) for d in e.get("outliers") or []]
        listed_excess = sum(max(d - p50, 0.0) for d in durations)
        excess = e.get("excess_s")
        rank = f"{e.get('node')}/{e.get('rank')}"
        per_rank[rank] = per_rank.get(rank, 0.0) + float(excess if excess is not None else listed_excess)
        count += int(e.get("number_of_outliers") or 0)
        steps += [int(n) for n in e.get("step_numbers") or []]
        windows += [(int(t), int(t + d * 1e6)) for t, d in zip(e.get("outlier_start_us") or [], durations)]
    stake = max(per_rank.values()) if per_rank else None  # ranks run side by side: the worst one's excess
    ranks = sorted(per_rank, key=lambda k: -per_rank[k])
    title = (f"{count} unusually slow steps cost {format_duration(stake or 0)} on "
             f"{'rank ' + ranks[0] if len(ranks) == 1 else f'{len(ranks)} ranks'}")
    parts = r.details.get("forward_backward") or {}
    mostly = max(parts.items(), key=lambda kv: kv[1])[0] if isinstance(parts, dict) and parts else None
    return [finding(r, s, "steps", title, stake, Where(sorted({k.split('/')[0] for k in ranks}), ranks,
                                                          sorted(set(steps))[:LISTED_STEPS],
                                                          sorted(windows)[:LISTED_WINDOWS]),
                    {"outlier_steps": count, "excess_s_per_rank": {k: per_rank[k] for k in ranks},
                     "outliers_mostly": mostly})]


@translates("MaxInitializationTime")
def _initialization(r: RuleResult, s: JobSummary) -> list[Finding]:
    if not r.fired:
        return []
    init = r.details.get("initialization_s")
    waited = r.details.get("waited_s")
    stake = float(init) if isinstance(init, (int, float)) else float(waited) if isinstance(waited, (int, float)) else None
    title = (f"Initialization took {format_duration(stake)} before the first step" if stake is not None
             else "The job took too long to reach its first step")
    start, first = r.details.get("job_start"), r.details.get("first_step")
    windows = [(int(start), int(first))] if isinstance(start, int) and isinstance(first, int) else []
    # measured against the whole job, not the loop: initialization is outside the loop
    share_base = s.duration_s
    f = finding(r, s, "start", title, stake, Where(list(s.nodes), windows=windows),
                {"initialization_s": init, "threshold_minutes": r.parameters.get("threshold")})
    share = stake / share_base if stake is not None and share_base > 0 else None
    severity = LOW if share is None else HIGH if share >= HIGH_SHARE else MEDIUM if share >= MEDIUM_SHARE else LOW
    return [Finding(f.id, f.rule, severity, f.title, f.time_at_stake_s, share, f.where, f.evidence,
                    f.recommendation, share_of="job")]


@translates("LowGPUUtilization")
def _low_gpu(r: RuleResult, s: JobSummary) -> list[Finding]:
    if not r.fired:
        return []
    flagged = r.details.get("flagged_windows") or {}
    windows = [(int(w["start_us"]), int(w["end_us"])) for w in flagged.get("windows") or []]
    total = int(flagged.get("total") or len(windows))
    mean_len = sum(b - a for a, b in windows) / len(windows) / 1e6 if windows else 0.0
    busy = [float(g["p50"]) for n, gpus in r.details.items() if isinstance(gpus, dict) and n != "flagged_windows"
            for g in gpus.values() if isinstance(g, dict) and g.get("case") and isinstance(g.get("p50"), (int, float))]
    idle_share = 1.0 - (sum(busy) / len(busy) / 100.0 if busy else 0.0)
    stake = total * mean_len * max(idle_share, 0.0) or None
    nodes = sorted({str(w.get("node")) for w in flagged.get("windows") or []})
    return [finding(r, s, "gpus", f"GPUs underused in {total} window(s)", stake,
                    Where(nodes, windows=windows[:LISTED_WINDOWS]),
                    {"flagged_windows": total, "median_utilization_of_flagged_gpus": busy[:16]})]


@translates("GPUMemoryIncrease")
def _memory(r: RuleResult, s: JobSummary) -> list[Finding]:
    if not r.fired:
        return []
    flagged = r.details.get("flagged_windows") or {}
    windows = [(int(w["start_us"]), int(w["end_us"])) for w in flagged.get("windows") or []]
    nodes = sorted({str(w.get("node")) for w in flagged.get("windows") or []})
    return [finding(r, s, "memory", "GPU memory kept growing: the job may run out of GPU memory", None,
                    Where(nodes, windows=windows[:LISTED_WINDOWS]), {"flagged_windows": flagged.get("total")},
                    severity=MEDIUM)]


@translates("MemoryGrowth")
def _memory_growth(r: RuleResult, s: JobSummary) -> list[Finding]:
    """A leak: high when it reaches its limit before the run has run as long again (the run's work so far is then
    at stake), else medium; where the capture saw it allocated, the line is in the title and the evidence."""
    from stallwatch.analyze.rules.memory_growth import MemoryGrowthDetails

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


@translates("BatchSize")
def _batch(r: RuleResult, s: JobSummary) -> list[Finding]:
    if not r.fired:
        return []
    flagged = r.details.get("flagged_windows") or {}
    nodes = sorted({str(w.get("node")) for w in flagged.get("windows") or []})
    return [finding(r, s, "batch", "CPUs and GPUs underused: the batch may be too small for this instance", None,
                    Where(nodes), {"flagged_windows": flagged.get("total")}, severity=LOW)]


@translates("LoadBalancing")
def _balance(r: RuleResult, s: JobSummary) -> list[Finding]:
    if not r.fired:
        return []
    nodes = sorted(n for n, e in r.details.items() if isinstance(e, dict) and e.get("imbalanced"))
    pairs = [p for n in nodes for p in r.details[n]["imbalanced"]]
    return [finding(r, s, "gpus", f"GPUs of {'node ' + nodes[0] if len(nodes) == 1 else 'several nodes'} had uneven "
                                  "workloads", None, Where(nodes), {"imbalanced_pairs": pairs[:20]},
                    severity=MEDIUM)]


@translates("Dataloader")
def _dataloader(r: RuleResult, s: JobSummary) -> list[Finding]:
    if not r.fired:
        return []
    nodes = {n: e for n, e in (r.details.get("nodes") or {}).items() if isinstance(e, dict) and e.get("triggered")}
    why = {"below": "too few data-loader workers", "above": "too many data-loader workers",
           "slow_fetch": "data-loader workers that cannot keep up"}
    parts = [f"{why.get(str(e.get('reason')), 'its data loading')} on node {n}" for n, e in nodes.items()]
    return [finding(r, s, "loader", "The data loader holds training back: " + "; ".join(parts[:4]), None,
                    Where(sorted(nodes)), {"nodes": nodes, "wait_share": r.details.get("wait_share")},
                    severity=MEDIUM)]


@translates("InputBound")
def _input_bound(r: RuleResult, s: JobSummary) -> list[Finding]:
    if not r.fired:
        return []
    fired = [e for e in (r.details.get("ranks") or {}).values() if isinstance(e, dict) and e.get("triggered")]
    windows = [(int(e["worst_window"]["start_us"]), int(e["worst_window"]["end_us"])) for e in fired
               if isinstance(e.get("worst_window"), dict)]
    steps = _ints(r.details.get("steps"))
    stake = r.details.get("time_at_stake_s")
    title = r.details.get("title") if isinstance(r.details.get("title"), str) else "Training waits for data"
    evidence = {f"{e['node']}/{e['rank']}": {"wait_share": e.get("wait_share"), "wait_s": e.get("wait_s"),
                                             "cause": e.get("cause"), "num_workers": e.get("num_workers")}
                for e in fired[:16]}
    return [finding(r, s, "data", title, _over_all_steps(stake, s),
                    Where(_strings(r.details.get("nodes")), _strings(r.details.get("ranks_fired")),
                          steps[:LISTED_STEPS], sorted(windows)[:LISTED_WINDOWS]), evidence)]


@translates("CPUContention")
def _contention(r: RuleResult, s: JobSummary) -> list[Finding]:
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
                    _over_all_steps(d.time_at_stake_s, s), Where(d.nodes_fired, d.ranks_fired), evidence)]


@translates("Straggler")
def _straggler(r: RuleResult, s: JobSummary) -> list[Finding]:
    stragglers = [x for x in r.details.get("stragglers") or [] if isinstance(x, dict)]
    if not r.fired or not stragglers:
        return []
    stake = r.details.get("time_at_stake_s")
    title = r.details.get("title") if isinstance(r.details.get("title"), str) else "A rank holds the others back"
    nodes = _strings(r.details.get("straggling_nodes")) or sorted({str(x.get("node")) for x in stragglers})
    since = [(int(x["since_us"]), int(s.loop.last_us)) for x in stragglers
             if isinstance(x.get("since_us"), int) and s.loop is not None]
    return [finding(r, s, "ranks", title, _over_all_steps(stake, s),
                    Where(nodes, [f"{x.get('node')}/{x.get('rank')}" for x in stragglers], [], since[:LISTED_WINDOWS]),
                    {"stragglers": stragglers[:16], "median_step_s": r.details.get("median_step_s")})]


@translates("CommunicationBound")
def _communication(r: RuleResult, s: JobSummary) -> list[Finding]:
    from stallwatch.analyze.rules.communication import CommunicationDetails

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
    return [finding(r, s, "comm", d.title or "Training waits for communication", _over_all_steps(d.time_at_stake_s, s),
                    Where(sorted({e.node for e in fired}), [e.key for e in fired], [], windows[:LISTED_WINDOWS]),
                    evidence)]


@translates("Hang")
def _hang(r: RuleResult, s: JobSummary) -> list[Finding]:
    from stallwatch.analyze.rules.hang import findings_of  # the rule's own room

    return findings_of(r, s)


def _over_all_steps(stake: Any, s: JobSummary) -> float | None:
    """A time at stake summed over steps, for all of them: where steps were sampled (analyze/sampled.py) the
    rule saw the timed ones only, which ran in a share `timed_share` of the ranks' loop time."""
    if not isinstance(stake, (int, float)) or isinstance(stake, bool):
        return None
    return float(stake) / s.timed_share if 0 < s.timed_share < 1 else float(stake)


def _generic(r: RuleResult, s: JobSummary) -> list[Finding]:
    """A rule without a translator of its own (a custom rule, a new one): one finding when it fired, with the
    time at stake it reports (Details `time_at_stake_s`) and what it names (`nodes`, `ranks`, `steps`)."""
    if not r.fired:
        return []
    d = r.details
    stake = d.get("time_at_stake_s")
    stake = float(stake) if isinstance(stake, (int, float)) and math.isfinite(stake) and stake >= 0 else None
    where = Where(_strings(d.get("nodes")), _strings(d.get("ranks")), _ints(d.get("steps"))[:LISTED_STEPS])
    title = d.get("title") if isinstance(d.get("title"), str) else f"{r.name} fired {_times(r.triggered)}"
    return [finding(r, s, "run", title, stake, where, {"triggered": r.triggered, "violations": r.violations})]


# -- ranking and the verdict ---------------------------------------------------------------------------------


def build_findings(results: list[RuleResult], summary: JobSummary, *, health: list[str] | None = None) -> Findings:
    """Every fired rule's findings, ranked by time at stake (then severity), and the verdict."""
    found: list[Finding] = []
    for result in results:
        if result.status != "ok" or result.imported:  # another tool's verdict is listed, not made a finding
            continue
        translate = _TRANSLATORS.get(result.name, _generic)
        try:
            found += translate(result, summary)
        except (KeyError, TypeError, ValueError):  # details of an unexpected shape (an old or foreign file)
            found += _generic(result, summary)
    found = _fold_outliers_into_input(_fold_loader_into_input(found))
    found.sort(key=lambda f: (-(f.time_at_stake_s if f.time_at_stake_s is not None else -1.0),
                              SEVERITIES.index(f.severity), f.id))
    # the machine's share (another process, a CPU limit, steal) is a finding, not a fault of the job's own
    healthy = not [f for f in found if f.rule not in MACHINE_RULES] \
        and summary.fate.state in ("succeeded", "stopped", "running") and summary.total_steps > 0 \
        and not summary.loop_undetermined
    said = verdict(summary, found, health or [], not_judged(results), death=_memory_death(results))
    return Findings(summary.uri, summary.fate, said, healthy, found,
                    summary.loop_s, list(health or []) if healthy else [], list(summary.notes), dict(summary.steps))


def _fold_loader_into_input(found: list[Finding]) -> list[Finding]:
    """InputBound and Dataloader see one problem from two sides (the wait, the workers): one finding, with the
    loader's advice added to the starved loop's."""
    loader = next((f for f in found if f.rule == "Dataloader"), None)
    starved = next((f for f in found if f.rule == "InputBound"), None)
    if loader is None or starved is None:
        return found
    # One piece of advice per loader: InputBound's, judged on the loader the loop waited for (its workers, the
    # cores they use, how cheap its batches are); of the Dataloader rule's, only what InputBound does not judge.
    extra = PIN_MEMORY_ADVICE if PIN_MEMORY_ADVICE in loader.recommendation else ""
    merged = Finding(starved.id, starved.rule, starved.severity, starved.title, starved.time_at_stake_s,
                     starved.share_of_loop, starved.where, {**starved.evidence, "dataloader": loader.evidence},
                     f"{starved.recommendation} {extra}".strip())
    return [merged if f is starved else f for f in found if f is not loader]


def _fold_outliers_into_input(found: list[Finding]) -> list[Finding]:
    """Slow steps that are the loop's stalls for data (most of their time went to waiting for a batch) are the
    starved loop's finding, not a second one: their steps and excess join it."""
    outliers = next((f for f in found if f.rule == "StepOutlier"), None)
    starved = next((f for f in found if f.rule == "InputBound"), None)
    if outliers is None or starved is None or outliers.evidence.get("outliers_mostly") != "data_wait":
        return found
    steps = sorted(set(starved.where.steps) | set(outliers.where.steps))[:LISTED_STEPS]
    where = Where(starved.where.nodes, sorted(set(starved.where.ranks) | set(outliers.where.ranks)), steps,
                  sorted(set(starved.where.windows) | set(outliers.where.windows))[:LISTED_WINDOWS])
    stake = max(x for x in (starved.time_at_stake_s, outliers.time_at_stake_s, 0.0) if x is not None)
    severity = min(starved.severity, outliers.severity, key=SEVERITIES.index)
    share = max(x for x in (starved.share_of_loop, outliers.share_of_loop, 0.0) if x is not None)
    merged = Finding(starved.id, starved.rule, severity, starved.title, stake, share or None, where,
                     {**starved.evidence, "slow_steps": outliers.evidence}, starved.recommendation)
    return [merged if f is starved else f for f in found if f is not outliers]


def not_judged(results: list[RuleResult]) -> list[str]:
    """The rules that apply to the run but judged nothing: it is shorter than the start-up each skips
    (`patience`; on an H100, a 32 s run at 9 % median GPU utilization read "Healthy" while every GPU rule
    was still skipping its first 1,000 snapshots)."""
    return sorted(r.name for r in results if r.status == "ok" and not r.imported and r.datapoints == 0
                  and "patience" in r.parameters and not r.details.get("nothing_to_compare"))


def _memory_death(results: list[RuleResult]) -> tuple[str, str] | None:
    """How the job died of memory (MemoryGrowth's `death`: what killed it, how memory grew), if it did."""
    r = next((r for r in results if r.name == "MemoryGrowth" and r.status == "ok"), None)
    death = r.details.get("death") if r is not None and isinstance(r.details, dict) else None
    if not isinstance(death, dict) or not isinstance(death.get("head"), str):
        return None
    return death["head"], death["growth"] if isinstance(death.get("growth"), str) else ""


def verdict(summary: JobSummary, found: list[Finding], health: list[str], unjudged: list[str] | None = None,
            death: tuple[str, str] | None = None) -> str:
    """One line: the job's fate first when it did not end well (what killed it, when it died of memory: "was
    killed by the out-of-memory killer at 31.2 GB of a 32 GB limit", and how memory grew before), then the top
    finding, else health (and the rules the run was too short for, so that it never reads as if they had
    looked)."""
    fate, top = summary.fate, (found[0] if found else None)
    lasted = format_duration(summary.duration_s)
    if fate.ended_badly or fate.state == "unknown":
        where = ("before its first step" if summary.total_steps == 0 else
                 f"after {summary.total_steps:,} steps")
        if death is not None and fate.ended_badly:
            head, growth = death
            text = f"The job {head} after {lasted}, {where}" + (f"; {growth}." if growth else ".")
            return text + (f" Before that: {_lower(top.title)}." if top and top.rule != "MemoryGrowth" else "")
        text = f"The job {fate.phrase()} after {lasted}, {where}."
        return text + (f" Before that: {_lower(top.title)}." if top else "")
    if summary.total_steps == 0:
        state = "is still running" if fate.state == "running" else fate.phrase()
        return (f"No training step was recorded (the job {state}, {lasted}): nothing in the training loop can be "
                "judged." + (f" {top.title}." if top else ""))
    machine_only = top is not None and not summary.loop_undetermined and all(f.rule in MACHINE_RULES for f in found)
    if top is not None:
        stake = ""
        if top.time_at_stake_s is not None and summary.loop_s > 0:
            # start-up and other time outside the loop are measured against the job, not the loop
            outside = top.time_at_stake_s > summary.loop_s and (summary.duration_s or 0) > summary.loop_s
            whole = (f"the job's {format_duration(summary.duration_s or 0)}" if outside
                     else f"the {format_duration(summary.loop_s)} training loop")
            stake = f": about {format_duration(top.time_at_stake_s)} of {whole} at stake"
        if machine_only:  # the job itself is healthy: what the machine did to it is said after that, not instead
            because = f" ({'; '.join(health)})" if health else ""
            state = "So far healthy: no rule has found a problem in the job itself" if fate.state == "running" \
                else f"Healthy: no rule found a problem in the job itself{because}"
            return f"{state}. The machine slowed it: {_lower(top.title)}{stake}."
        more = f" ({len(found)} findings)" if len(found) > 1 else ""
        prefix = "So far: " if fate.state == "running" else ""
        return f"{prefix}{top.title}{stake}{more}."
    if summary.loop_undetermined:
        return (f"Inconclusive: the training loop's steps could not be found ({summary.total_steps:,} recorded is "
                "not the loop's count), so the rules could not judge it; mark steps with "
                "stallwatch.torch.profile().step().")
    if fate.state == "running":
        return "So far healthy: no rule has found a problem yet."
    because = f" ({'; '.join(health)})" if health else ""
    short = ""
    if unjudged:
        names = unjudged[0] if len(unjudged) == 1 else f"{', '.join(unjudged[:-1])} and {unjudged[-1]}"
        example = "LowGPUUtilization" if "LowGPUUtilization" in unjudged else unjudged[0]
        short = (f" Too short for {names} to judge: each skips the run's start-up (its `patience` parameter); "
                 f"`stallwatch rules RUN --param {example}.patience=0` judges it anyway (so does `--param` on "
                 "`run`, `report` and `summary`).")
    return f"Healthy: no rule found a problem{because}.{short}"


def health_evidence(results: Mapping[str, RuleResult]) -> list[str]:
    """The numbers behind "healthy": where the loop's time went and how busy the machines were."""
    out = []
    fw = results.get("OverallFrameworkMetrics")
    if fw is not None and fw.applies:
        phase = fw.details.get("phase") or {}
        train = phase.get("TRAIN")
        if isinstance(train, (int, float)):
            out.append(f"training steps {train:.0f} % of the loop")
        general_us, phase_us = fw.details.get("general_us") or {}, fw.details.get("phase_us") or {}
        in_steps = _timed_step_us(phase_us, fw.details.get("untimed_us"))
        wait = general_us.get("data_wait")
        if isinstance(wait, (int, float)) and in_steps > 0:
            out.append(f"waiting for data {100.0 * wait / in_steps:.0f} % of step time")
        own = _loop_code(fw.details.get("ranks") or {})
        if own is not None:
            usage = results.get("OverallSystemUsage")
            gpus = usage is not None and usage.applies and bool(usage.details.get("GPU"))
            # CUDA runs asynchronously: the model's calls return once their kernels are queued, and the loop
            # waits for them where it reads a result (`loss.item()`), outside every timed phase
            where = ("the loop's own code or a wait for the GPU (a sync such as `loss.item()`)" if gpus
                     else "the loop's own code")
            out.append(f"{own[1]:.0f} % of step time on rank {own[0]} in {where}, outside the model and the data "
                       "loader")
    outliers = results.get("StepOutlier")
    if outliers is not None and outliers.applies:
        out.append(f"{outliers.datapoints:,} steps checked, no outlier series")
    usage = results.get("OverallSystemUsage")
    if usage is not None and usage.applies:
        for metric in ("GPU", "CPU"):
            per_node = usage.details.get(metric) or {}
            p50 = [v.get("p50") for v in per_node.values() if isinstance(v, dict)
                   and isinstance(v.get("p50"), (int, float))]
            if p50:
                out.append(f"median {metric} utilization {min(p50):.0f}–{max(p50):.0f} %" if len(p50) > 1
                           else f"median {metric} utilization {p50[0]:.0f} %")
    return out


LOOP_CODE_SHARE = 20.0  # % of step time outside every timed phase worth saying in a healthy verdict


def _timed_step_us(phase_us: Mapping[str, Any], untimed_us: Any) -> float:
    """The time in timed steps: the steps' share of the loop less the stretches of sampled steps that were counted,
    not timed (their phases are unknown), so that shares of step time compare timed phases with timed steps."""
    steps = sum(v for k, v in phase_us.items() if k != "others" and isinstance(v, (int, float)))
    if isinstance(untimed_us, Mapping):
        steps -= sum(v for v in untimed_us.values() if isinstance(v, (int, float)))
    return steps


def _loop_code(ranks: Mapping[str, Any]) -> tuple[str, float] | None:
    """The rank whose steps spend the largest share (at least LOOP_CODE_SHARE %) in none of their timed phases —
    the steps table's "other" — as ("node/rank", %); None when no rank does (or its phases are not timed)."""
    worst: tuple[str, float] | None = None
    for name, r in ranks.items():
        if not isinstance(r, dict):
            continue
        steps = _timed_step_us(r.get("phase_us") or {}, r.get("untimed_us"))
        events = r.get("events_us") or {}
        timed = [events.get(k) for k in (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE)]
        if steps <= 0 or not isinstance(events.get(FORWARD), (int, float)):
            continue  # the model's calls are not timed (Keras on JAX): the rest is unknown, not the loop's
        share = 100.0 * (1.0 - sum(v for v in timed if isinstance(v, (int, float))) / steps)
        if share >= LOOP_CODE_SHARE and (worst is None or share > worst[1]):
            worst = (str(name), share)
    return worst


def _slug(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and (not name[i - 1].isupper() or (i + 1 < len(name) and name[i + 1].islower())):
            out.append("-")
        out.append(ch.lower())
    return "".join(out)


def _pct(value: Any) -> str:
    return f"{float(value):.0f} %" if isinstance(value, (int, float)) else "much"


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n:,} times"


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _ints(value: Any) -> list[int]:
    return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, list) else []


def _plain(value: Any) -> Any:
    """Evidence as plain JSON values (numpy scalars and tuples included)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value
