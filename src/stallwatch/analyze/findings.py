"""What to fix first: the rules' results turned into findings — one per problem found, with its evidence
(numbers, nodes, ranks, steps, time windows), the training time at stake and the change to try — ranked by
that time, and one verdict line that agrees with the first finding and with the job's fate. What the top of the
report, the terminal summary, `findings.json`, the notebook and the dashboard show (RULES.md, "Findings")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from stallwatch.analyze.finding import (  # noqa: F401 (this module's API too)
    HIGH,
    LISTED_STEPS,
    LISTED_WINDOWS,
    LOW,
    MEDIUM,
    SEVERITIES,
    Finding,
    Where,
    finding,
    rounded,
    share_text,
)
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.dataloader import PIN_MEMORY_ADVICE
from stallwatch.analyze.rules.framework_metrics import OverallFrameworkMetricsDetails, RankMetrics
from stallwatch.analyze.rules.input_bound import InputBoundDetails
from stallwatch.analyze.rules.kit.details import Coverage, GenericDetails
from stallwatch.analyze.rules.memory_growth import MemoryGrowthDetails
from stallwatch.analyze.rules.registry import all_rules
from stallwatch.analyze.rules.system_usage import OverallSystemUsageDetails
from stallwatch.analyze.summary import JobFate, JobSummary
from stallwatch.records import BACKWARD, COLLECTIVE, DATA_WAIT, FORWARD, OPTIMIZER, TRAIN
from stallwatch.timeutil import format_duration


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
                "verdict": self.verdict, "healthy": self.healthy, "training_loop_s": rounded(self.loop_s),
                "steps": dict(self.steps),
                "evidence": list(self.evidence), "notes": list(self.notes),
                "findings": [f.to_json() for f in self.findings]}


MACHINE_RULES = ("CPUContention",)  # findings about what the machine did to the job: a healthy job can have them


# -- per-rule translation: each rule's own (`Rule.findings`, in its module, from its typed Details) --------------


def _translator(name: str) -> Callable[[RuleResult, JobSummary], list[Finding]]:
    """The rule's own translation into findings, or the generic one (a custom rule, a result of another tool)."""
    cls = next((c for c in all_rules() if c.name == name), None)
    return cls.findings if cls is not None and cls.translates() else _generic


def _generic(r: RuleResult, s: JobSummary) -> list[Finding]:
    """A rule without a translator of its own (a custom rule, a new one): one finding when it fired, with the
    time at stake it reports (Details `time_at_stake_s`) and what it names (`nodes`, `ranks`, `steps`)."""
    if not r.fired:
        return []
    d = GenericDetails.from_json(r.details)
    stake = float(d.time_at_stake_s) if d.time_at_stake_s is not None and d.time_at_stake_s >= 0 else None
    where = Where(d.nodes, d.ranks, d.steps[:LISTED_STEPS])
    title = d.title if d.title is not None else f"{r.name} fired {_times(r.triggered)}"
    return [finding(r, s, "run", title, stake, where, {"triggered": r.triggered, "violations": r.violations})]


# -- ranking and the verdict ---------------------------------------------------------------------------------


def build_findings(results: list[RuleResult], summary: JobSummary, *, health: list[str] | None = None) -> Findings:
    """Every fired rule's findings, ranked by time at stake (then severity), and the verdict."""
    found: list[Finding] = []
    for result in results:
        if result.status != "ok" or result.imported:  # another tool's verdict is listed, not made a finding
            continue
        translate = _translator(result.name)
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
                  and "patience" in r.parameters and not Coverage.from_json(r.details).nothing_to_compare)


def _memory_death(results: list[RuleResult]) -> tuple[str, str] | None:
    """How the job died of memory (MemoryGrowth's `death`: what killed it, how memory grew), if it did."""
    r = next((r for r in results if r.name == "MemoryGrowth" and r.status == "ok"), None)
    if r is None:
        return None
    try:
        death = MemoryGrowthDetails.from_json(r.details).death
    except (KeyError, TypeError, ValueError):  # details of another shape (an old or foreign file)
        return None
    if death is None or not isinstance(death.head, str):
        return None
    return death.head, death.growth if isinstance(death.growth, str) else ""


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
        d = OverallFrameworkMetricsDetails.from_json(fw.details)
        train = d.phase.get(TRAIN)
        if train is not None:
            out.append(f"training steps {train:.0f} % of the loop")
        in_steps = _timed_step_us(d.phase_us, d.untimed_us)
        wait = d.general_us.get(DATA_WAIT)
        starved = results.get("InputBound")
        # the wait as InputBound judged it (a busy machine's share taken out), the figure held against its threshold
        judged = (InputBoundDetails.from_json(starved.details).train_wait_share()
                  if starved is not None and starved.applies else None)
        if judged is not None:
            out.append(f"waiting for data {judged:.0f} % of step time")
        elif wait is not None and in_steps > 0:
            out.append(f"waiting for data {100.0 * wait / in_steps:.0f} % of step time")
        own = _loop_code(d.ranks)
        if own is not None:
            usage = results.get("OverallSystemUsage")
            gpus = usage is not None and usage.applies and bool(OverallSystemUsageDetails.from_json(usage.details).gpu)
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
        u = OverallSystemUsageDetails.from_json(usage.details)
        for metric, per_node in (("GPU", u.gpu), ("CPU", u.cpu)):
            p50 = [v.p50 for v in per_node.values() if v.p50 is not None]
            if p50:
                out.append(f"median {metric} utilization {min(p50):.0f}–{max(p50):.0f} %" if len(p50) > 1
                           else f"median {metric} utilization {p50[0]:.0f} %")
    return out


LOOP_CODE_SHARE = 20.0  # % of step time outside every timed phase worth saying in a healthy verdict


def _timed_step_us(phase_us: Mapping[str, int], untimed_us: Mapping[str, int]) -> float:
    """The time in timed steps: the steps' share of the loop less the stretches of sampled steps that were counted,
    not timed (their phases are unknown), so that shares of step time compare timed phases with timed steps."""
    return sum(v for k, v in phase_us.items() if k != "others") - sum(untimed_us.values())


def _loop_code(ranks: Mapping[str, RankMetrics]) -> tuple[str, float] | None:
    """The rank whose steps spend the largest share (at least LOOP_CODE_SHARE %) in none of their timed phases —
    the steps table's "other" — as ("node/rank", %); None when no rank does (or its phases are not timed)."""
    worst: tuple[str, float] | None = None
    for name, r in ranks.items():
        steps = _timed_step_us(r.phase_us, r.untimed_us)
        events = r.events_us
        timed = [events.get(k) for k in (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE)]
        if steps <= 0 or events.get(FORWARD) is None:
            continue  # the model's calls are not timed (Keras on JAX): the rest is unknown, not the loop's
        share = 100.0 * (1.0 - sum(v for v in timed if v is not None) / steps)
        if share >= LOOP_CODE_SHARE and (worst is None or share > worst[1]):
            worst = (str(name), share)
    return worst


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n:,} times"


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


