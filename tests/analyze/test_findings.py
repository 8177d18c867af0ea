"""Findings: each fired rule becomes findings with evidence and the training time at stake, ranked by that
time; the verdict puts the job's fate first and agrees with the top finding; a healthy run says so with its
evidence; findings.json has RULES.md's shape."""

from __future__ import annotations

import json
from dataclasses import replace

from stallwatch.analyze.findings import HIGH, LOW, MEDIUM, build_findings, health_evidence
from stallwatch.analyze.results import NOT_APPLICABLE, RuleResult
from stallwatch.analyze.rules.dataloader import PIN_MEMORY_ADVICE
from stallwatch.analyze.steps import LoopSpan
from stallwatch.analyze.summary import JobSummary, node_fate

T0 = 1_763_790_000_000_000
S = 1_000_000


def _summary(*, exit_code: int = 0, signal: str | None = None, steps: int = 1000, loop_s: float = 100.0,
             interrupted: bool = False) -> JobSummary:
    record = {"status": "finished", "exit_code": exit_code, "exit_signal": signal, "interrupted": interrupted}
    loop = LoopSpan(T0 + 10 * S, T0 + 10 * S + int(loop_s * S), steps) if steps else None
    return JobSummary(run_id="r", uri="runs/r", command=["python", "train.py"], start_us=T0,
                      end_us=T0 + int((loop_s + 20) * S), data_end_us=None, nodes=["algo-1", "algo-2"],
                      ranks={"algo-1": ["0"], "algo-2": ["1"]}, steps={"TRAIN": steps} if steps else {}, loop=loop,
                      sample_interval_ms={"algo-1": 500.0, "algo-2": 500.0}, fate=node_fate(record))


def _rule(name: str, triggered: int, details: dict, **kw) -> RuleResult:
    return RuleResult(name, triggered, triggered, 1000, kw.pop("parameters", {}), f"{name} looks.",
                      f"Fix what {name} found.", details, **kw)


def _bottleneck(count: int) -> RuleResult:
    return _rule("CPUBottleneck", 40, {
        "bottlenecks": {"count": count, "ranges": [{"node": "algo-2", "start_us": T0 + 20 * S,
                                                    "end_us": T0 + 30 * S, "snapshots": 20}]},
        "nodes": {"algo-1": {"above_threshold": False, "bottlenecks": 0, "percent": 0.0},
                  "algo-2": {"above_threshold": True, "bottlenecks": count, "percent": 62.5, "datapoints": 96}}},
        parameters={"threshold": 50})


def _outliers() -> RuleResult:
    entry = {"node": "algo-1", "rank": 0, "phase": "TRAIN", "triggered": True, "number_of_outliers": 12,
             "step_stats": {"p50": 0.1}, "outliers": [0.6, 0.5], "step_numbers": [100, 200],
             "outlier_start_us": [T0 + 15 * S, T0 + 25 * S], "excess_s": 4.5}
    quiet = dict(entry, rank=1, node="algo-2", triggered=False, excess_s=0.1)
    return _rule("StepOutlier", 1, {"step_details": {"algo-1/0/TRAIN": entry, "algo-2/1/TRAIN": quiet}})


def test_each_rule_becomes_a_finding_with_evidence_and_time_at_stake():
    found = build_findings([_bottleneck(96), _outliers()], _summary())
    top, second = found.findings
    assert top.rule == "CPUBottleneck" and top.id == "cpu-bottleneck/algo-2"
    assert top.time_at_stake_s == 96 * 0.5 and top.share_of_loop == 0.48 and top.severity == HIGH
    assert top.where.nodes == ["algo-2"] and top.where.windows == [(T0 + 20 * S, T0 + 30 * S)]
    assert top.evidence["bottleneck_snapshots"] == 96 and top.recommendation == "Fix what CPUBottleneck found."
    assert second.rule == "StepOutlier" and second.time_at_stake_s == 4.5 and second.severity == LOW
    assert second.where.ranks == ["algo-1/0"] and second.where.steps == [100, 200]
    assert found.verdict.startswith(top.title) and "about 48.0 s of the 1m 40s training loop at stake" in found.verdict
    assert not found.healthy


def test_ranked_by_time_at_stake():
    found = build_findings([_outliers(), _bottleneck(4)], _summary())  # 2 s of bottleneck < 4.5 s of outliers
    assert [f.rule for f in found.findings] == ["StepOutlier", "CPUBottleneck"]


def test_rules_that_did_not_fire_or_do_not_apply_make_no_finding():
    quiet = _rule("StepOutlier", 0, {"step_details": {}})
    na = _rule("LowGPUUtilization", 0, {}, status=NOT_APPLICABLE, message="no GPU data")
    found = build_findings([quiet, na], _summary(), health=["training steps 93 % of the loop"])
    assert found.findings == [] and found.healthy
    assert found.verdict == "Healthy: no rule found a problem (training steps 93 % of the loop)."


def test_a_run_shorter_than_a_rules_start_up_skip_says_that_rule_did_not_judge_it():
    """On an H100, a 32 s run at 9 % median GPU utilization read "Healthy" while the GPU rules still skipped
    their first 1,000 snapshots."""
    def skipped(name):
        return RuleResult(name, 0, 0, 0, {"patience": 1000, "window": 500}, "", "", {})
    quiet = _rule("StepOutlier", 0, {"step_details": {}})
    found = build_findings([quiet, skipped("LowGPUUtilization"), skipped("BatchSize")], _summary(),
                           health=["median GPU utilization 9 %"])
    assert found.healthy and found.findings == []
    assert found.verdict == (
        "Healthy: no rule found a problem (median GPU utilization 9 %). Too short for BatchSize and LowGPUUtilization "
        "to judge: each skips the run's start-up (its `patience` parameter); "
        "`stallwatch rules RUN --param LowGPUUtilization.patience=0` judges it anyway (so does `--param` on `run`, "
        "`report` and `summary`).")
    single = replace(skipped("LoadBalancing"), details={"nothing_to_compare": True})  # one GPU: never judged
    assert "LoadBalancing" not in build_findings([quiet, single], _summary()).verdict
    judged = replace(skipped("LowGPUUtilization"), datapoints=10)
    assert "Too short" not in build_findings([quiet, judged], _summary()).verdict


def test_a_stake_longer_than_the_loop_is_not_read_as_a_share_above_100_percent():
    from stallwatch.analyze.findings import share_text
    assert share_text(0.41) == "41 % of the loop" and share_text(None) is None
    assert share_text(1.27) == "more than the loop: time outside it counts"


def test_start_up_time_is_said_as_a_share_of_the_job_not_of_the_loop():
    """Initialization lies outside the loop: 30 s of a 60 s job (40 s loop) read "(83 % of the loop)" where it meant the job."""
    from stallwatch.analyze.findings import share_text
    from stallwatch.present.console import findings_text

    init = _rule("MaxInitializationTime", 1, {"initialization_s": 30.0, "job_start": T0, "first_step": T0 + 30 * S},
                 parameters={"threshold": 0.5})
    (f,) = build_findings([init], _summary(loop_s=40.0)).findings
    assert f.share_of == "job" and f.share_of_loop == 0.5 and f.to_json()["share_of"] == "job"
    assert share_text(f.share_of_loop, f.share_of) == "50 % of the job"
    assert "(50 % of the job)" in findings_text(build_findings([init], _summary(loop_s=40.0)))


def test_a_crash_comes_first_and_never_reads_healthy():
    found = build_findings([], _summary(exit_code=1))
    assert not found.healthy
    assert found.verdict.startswith("The job failed with exit code 1 after 2m 00s, after 1,000 steps.")
    killed = build_findings([_bottleneck(96)], _summary(exit_code=137, signal="SIGKILL"))
    assert killed.verdict.startswith("The job was killed by SIGKILL (exit code 137)")
    assert "Before that: " in killed.verdict and killed.findings[0].rule == "CPUBottleneck"
    stopped = build_findings([], _summary(exit_code=130, signal="SIGINT", interrupted=True))
    assert "was interrupted by SIGINT" in stopped.verdict and stopped.fate.interrupted


def test_a_job_that_ended_before_its_first_step_says_exactly_that():
    found = build_findings([], _summary(exit_code=2, steps=0))
    assert found.verdict.startswith("The job failed with exit code 2 after") and "before its first step" in found.verdict
    assert not found.healthy
    quiet = build_findings([], _summary(steps=0))
    assert quiet.verdict.startswith("No training step was recorded") and not quiet.healthy


def test_a_custom_rule_reports_its_own_time_at_stake():
    custom = _rule("BusyCpu", 3, {"time_at_stake_s": 30.0, "ranks": ["algo-1/0"], "title": "The CPU was busy"})
    (f,) = build_findings([custom], _summary()).findings
    assert (f.id, f.title, f.time_at_stake_s, f.severity, f.where.ranks) == (
        "busy-cpu/run", "The CPU was busy", 30.0, HIGH, ["algo-1/0"])


def test_details_of_an_unexpected_shape_still_make_a_finding():
    broken = _rule("CPUBottleneck", 5, {"nodes": {"algo-1": {"above_threshold": True, "bottlenecks": "many"}}})
    (f,) = build_findings([broken], _summary()).findings
    assert f.rule == "CPUBottleneck" and f.severity in (LOW, MEDIUM, HIGH)


def test_findings_json_has_the_documented_shape():
    doc = json.loads(json.dumps(build_findings([_bottleneck(96)], _summary(exit_code=143, signal="SIGTERM")).to_json()))
    assert set(doc) >= {"run", "exit", "verdict", "findings", "healthy", "training_loop_s"}
    assert doc["exit"] == {"code": 143, "signal": "SIGTERM", "interrupted": True, "state": "interrupted",
                           "stop_reason": None, "node": None}
    (f,) = doc["findings"]
    assert set(f) == {"id", "rule", "severity", "title", "time_at_stake_s", "share_of_loop", "share_of", "where", "evidence",
                      "recommendation"}
    assert set(f["where"]) == {"nodes", "ranks", "steps", "windows"}


def test_health_evidence_from_the_overall_rules():
    fw = _rule("OverallFrameworkMetrics", 0, {"phase": {"TRAIN": 93.0, "others": 7.0},
                                              "phase_us": {"TRAIN": 93 * S, "others": 7 * S},
                                              "general_us": {"data_wait": 2 * S}})
    usage = _rule("OverallSystemUsage", 0, {"GPU": {"a": {"p50": 88.0}, "b": {"p50": 91.0}}, "CPU": {"a": {"p50": 40.0}}})
    assert health_evidence({"OverallFrameworkMetrics": fw, "OverallSystemUsage": usage}) == [
        "training steps 93 % of the loop", "waiting for data 2 % of step time", "median GPU utilization 88–91 %",
        "median CPU utilization 40 %"]


def test_health_evidence_quotes_the_wait_inputbound_judged():
    """On a busy machine the steps' waits as recorded read 21 %; InputBound, judging each step's own time (the
    waits for a CPU taken out), held 12 % against its 20 %: the healthy line says 12 %, not a figure above the
    threshold of a rule that stayed silent."""
    fw = _rule("OverallFrameworkMetrics", 0, {"phase": {"TRAIN": 100.0, "others": 0.0},
                                              "phase_us": {"TRAIN": 100 * S, "others": 0},
                                              "general_us": {"data_wait": 21 * S}})
    ib = _rule("InputBound", 0, {"ranks": {"a/0/TRAIN": {"phase": "TRAIN", "wait_share": 12.1, "triggered": False},
                                           "a/1/TRAIN": {"phase": "TRAIN", "wait_share": 9.0, "triggered": False},
                                           "a/0/EVAL": {"phase": "EVAL", "wait_share": 60.0, "triggered": False}}})
    assert health_evidence({"OverallFrameworkMetrics": fw, "InputBound": ib})[:2] == [
        "training steps 100 % of the loop", "waiting for data 12 % of step time"]
    assert health_evidence({"OverallFrameworkMetrics": fw})[1] == "waiting for data 21 % of step time"


def test_health_evidence_of_sampled_steps_shares_timed_step_time_only():
    """Steps sampled: 90 s of the loop's 100 s in steps counted, not timed (`untimed_us`): the data wait (1 s) and
    the loop's own code are shares of the 10 s of timed steps, not of 100 s (which read 1 % and 94 %)."""
    fw = _rule("OverallFrameworkMetrics", 0, {
        "phase": {"TRAIN": 100.0, "others": 0.0}, "phase_us": {"TRAIN": 100 * S, "others": 0},
        "untimed_us": {"TRAIN": 90 * S}, "general_us": {"data_wait": 1 * S},
        "ranks": {"a/0": {"phase_us": {"TRAIN": 100 * S, "others": 0}, "untimed_us": {"TRAIN": 90 * S},
                          "events_us": {"data_wait": 1 * S, "forward": 3 * S, "backward": 1 * S}}}})
    assert health_evidence({"OverallFrameworkMetrics": fw}) == [
        "training steps 100 % of the loop", "waiting for data 10 % of step time",
        "50 % of step time on rank a/0 in the loop's own code, outside the model and the data loader"]


def test_a_starved_loop_is_one_finding_with_the_loaders_advice():
    """InputBound (the wait) and Dataloader (the workers) see one problem: one finding, with InputBound's advice
    alone (judged on the loader the loop waited for); the Dataloader's evidence joins it."""
    starved = _rule("InputBound", 1, {"ranks": {"algo-1/0/TRAIN": {"node": "algo-1", "rank": 0, "triggered": True,
                                                                    "wait_share": 41.0, "wait_s": 24.6,
                                                                    "cause": "main_process"}},
                                       "time_at_stake_s": 24.6, "nodes": ["algo-1"], "ranks_fired": ["algo-1/0"],
                                       "title": "Training waits for data 41 % of the time on rank algo-1/0"})
    loader = _rule("Dataloader", 1, {"nodes": {"algo-1": {"triggered": True, "reason": "above"}}})
    (f,) = build_findings([loader, starved], _summary(loop_s=60.0)).findings
    assert f.rule == "InputBound" and f.time_at_stake_s == 24.6 and f.severity == HIGH
    assert "Fix what Dataloader found." not in f.recommendation and "dataloader" in f.evidence
    assert f.recommendation.startswith("Fix what InputBound found.")
    (alone,) = build_findings([loader], _summary()).findings
    assert alone.rule == "Dataloader" and alone.title.startswith("The data loader holds training back: too many")


def test_a_starved_loop_names_the_worker_count_once():
    """Loading in the training process, and too few workers: both rules say "add workers" — the finding says it once
    (it said num_workers=1 and then num_workers=2), keeping the loader's pin_memory advice."""
    starved = _rule("InputBound", 1, {"ranks": {"algo-1/0/TRAIN": {"node": "algo-1", "rank": 0, "triggered": True,
                                                                    "wait_share": 60.0, "wait_s": 7.2,
                                                                    "cause": "main_process"}},
                                       "time_at_stake_s": 7.2, "nodes": ["algo-1"], "ranks_fired": ["algo-1/0"]})
    for extra, kept in (("", False), (" " + PIN_MEMORY_ADVICE, True)):
        loader = replace(_rule("Dataloader", 1, {"nodes": {"algo-1": {"triggered": True, "reason": "below"}}}),
                         recommendation="Node algo-1 ran 0 data-loader workers: try num_workers=7." + extra)
        (f,) = build_findings([loader, starved], _summary(loop_s=12.0)).findings
        assert "num_workers=7" not in f.recommendation and f.recommendation.startswith("Fix what InputBound found.")
        assert (PIN_MEMORY_ADVICE in f.recommendation) is kept


def test_a_healthy_job_on_a_busy_machine_reads_healthy_and_then_says_what_the_machine_did():
    """CPUContention is about the machine, not the job: the verdict stays Healthy, with the contention after it."""
    contention = _rule("CPUContention", 1, {
        "ranks": {"algo-1/0": {"node": "algo-1", "rank": 0, "steps": 1000, "step_s": 100.0, "runq_s": 30.0,
                               "share": 30.0, "triggered": True}},
        "nodes": {}, "threshold": 10.0, "time_at_stake_s": 30.0, "ranks_fired": ["algo-1/0"],
        "nodes_with_contention": [], "cause": "oversubscribed", "title": "Other processes take the job's CPUs"})
    found = build_findings([contention], _summary())
    assert found.healthy and [f.rule for f in found.findings] == ["CPUContention"]
    assert found.verdict.startswith("Healthy: no rule found a problem in the job itself"), found.verdict
    assert "The machine slowed it: other processes take the job's CPUs: about 30.0 s" in found.verdict
    both = build_findings([contention, _outliers()], _summary())  # a finding of the job's own: no longer healthy
    assert not both.healthy and not both.verdict.startswith("Healthy")
