"""Section 2, System usage statistics: the OverallSystemUsage rule's numbers, as they are, and the per-node
verdict of the seeds — CPU-only nodes included (the seeds' version crashed on those)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.system_usage import OverallSystemUsageDetails
from stallwatch.present.report.model import GOOD, INFO, ISSUE, WARN, Chart, NotApplicable, Table, Verdict
from stallwatch.present.report.sections import system_usage
from stallwatch.present.report.sections.system_usage import node_verdict
from stallwatch.store.reader import open_run

from .._full_runs import full_run

STATS = ("max", "p99", "p95", "p50", "min")


def _stats(p95: float, p50: float | None = None) -> dict[str, float]:
    p50 = p95 - 10 if p50 is None else p50
    return {"max": p95 + 3, "p99": p95 + 1, "p95": p95, "p50": p50, "min": 0.0}


def _build(root: Path):
    ctx = RunAnalysis(open_run(str(root)))
    (section,) = system_usage.build(ctx)
    assert (section.id, section.title) == ("system-usage", "System usage statistics")
    return ctx, section


def test_the_table_holds_the_rules_numbers(tmp_path: Path):
    ctx, section = _build(full_run(tmp_path / "run", nodes=("algo-1", "algo-2"), gpus=2).root)
    details = ctx.rule("OverallSystemUsage").details
    table = next(b for b in section.blocks if isinstance(b, Table) and b.columns[:3] == ["node", "metric", "unit"])
    assert len(table.rows) == 2 * 6  # six metrics a node
    for node, metric, unit, *values in table.rows:
        scale = 1e6 if metric == "Network" else 1.0
        assert values == pytest.approx([details[metric][node][k] / scale for k in STATS]), (node, metric)
        assert unit == ("MB/s" if metric == "Network" else "% (I/O wait)" if metric == "I/O" else "%")
    rates = next(b for b in section.blocks if isinstance(b, Table) and b.caption == "Disk and network throughput")
    assert {r[1] for r in rates.rows} == {"disk read", "disk write", "network received", "network sent"}
    charts = [b for b in section.blocks if isinstance(b, Chart)]
    assert len(charts) == 2
    assert list(charts[0].model.categories) == ["cpu0", "cpu1", "cpu2", "cpu3", "gpu0", "gpu1", "gpu0 mem",
                                                     "gpu1 mem"]
    verdicts = [b for b in section.blocks if isinstance(b, Verdict)]
    assert [v.level for v in verdicts] == [GOOD, GOOD]  # generated GPUs run at 80 %: well utilized


def test_a_cpu_only_run_is_judged_on_its_cpus(tmp_path: Path):
    ctx, section = _build(full_run(tmp_path / "run", gpus=0).root)
    table = next(b for b in section.blocks if isinstance(b, Table))
    assert {r[1] for r in table.rows} == {"CPU", "CPU memory", "I/O", "Network"}
    p95 = ctx.rule("OverallSystemUsage").details["CPU"]["algo-1"]["p95"]
    assert 30 < p95 < 35  # generated: 30 ± 5 %
    (verdict,) = [b for b in section.blocks if isinstance(b, Verdict)]
    assert verdict.level == WARN and f"total CPU utilization on node algo-1 is only {p95:.0f} %" in verdict.text
    assert "saturated" not in verdict.text


def test_without_the_rules_result_it_says_why(tmp_path: Path):
    root = full_run(tmp_path / "run", gpus=0, framework=False).root
    result = {"RuleName": "OverallSystemUsage", "Status": "not_applicable", "Details": {},
              "Message": "no system data: no node reported any snapshot"}
    (section,) = system_usage.build(RunAnalysis(open_run(str(root)), rule_results=[RuleResult.from_json(result)]))
    assert section.blocks == [NotApplicable("No system usage statistics: no system data: no node reported any "
                                            "snapshot.")]


@pytest.mark.parametrize("cpu, gpu, level, words", [
    (_stats(50), _stats(50), WARN, "node n1 is underutilized. You may want to consider switching to a smaller"),
    (_stats(90), _stats(50), ISSUE, "likely because of CPU bottlenecks"),
    (_stats(60), _stats(95, 85), GOOD, "the GPUs on node n1 are well utilized"),
    (_stats(60), _stats(80, 60), INFO, "The median total GPU utilization on node n1 is 60 %, the median total CPU"),
    (None, _stats(80, 60), INFO, "The median total GPU utilization on node n1 is 60 %."),
    (_stats(90), None, GOOD, "the CPUs on node n1 are well utilized"),  # the seeds' CPU-only text crashed
    (_stats(40), None, WARN, "node n1 is underutilized; a smaller instance would do."),
])
def test_node_verdict(cpu, gpu, level, words):
    details = {k: {"n1": v} for k, v in (("CPU", cpu), ("GPU", gpu)) if v is not None}
    v = node_verdict("n1", OverallSystemUsageDetails.from_json(details))
    assert v is not None and v.level == level and words in v.text, v


def test_one_saturated_core_tempers_underutilized():
    devices = {"n1": {"cpu0": {"cpu_util": _stats(20)}, "cpu1": {"cpu_util": _stats(97)}}}
    v = node_verdict("n1", OverallSystemUsageDetails.from_json({"CPU": {"n1": _stats(55)}, "devices": devices}))
    assert v is not None and v.level == WARN and "However, core cpu1 was saturated (95th percentile 97 %)" in v.text
    no_totals = OverallSystemUsageDetails.from_json({"devices": devices})
    assert node_verdict("n1", no_totals) is None  # no totals, no verdict


# -- whose CPU it is: the job's own processes beside the host -------------------------------------------------


def _busy_host_run(root: Path, *, job_pct: float, workers: int = 2) -> Path:
    """A CPU-only node whose CPUs are busy (85 % host-wide); the job's own processes use `job_pct` of them."""
    from tests.analyze.rules._gen import make_node
    from tests.present.generated_run import write_run

    frame = make_node("algo-1", 400, cores=8, gpus=0, cpu_util=85.0)
    n = len(frame)
    frame.columns["proc/cpu_util"] = np.full(n, job_pct)
    frame.columns["proc/rss_bytes"] = np.linspace(1e9, 2e9, n)
    frame.columns["proc/workers_alive"] = np.full(n, float(workers))
    frame.columns["proc/workers_cpu_util"] = np.full(n, job_pct / 2)
    return write_run(root, [frame])


def test_a_host_busy_with_other_work_is_not_the_job_using_its_cpus(tmp_path: Path):
    ctx, section = _build(_busy_host_run(tmp_path / "run", job_pct=21.0))
    (verdict,) = [b for b in section.blocks if isinstance(b, Verdict)]
    assert "well utilized" not in verdict.text and verdict.level == WARN, verdict
    assert "other work on the host" in verdict.text and "used 21 % of the host's cores" in verdict.text
    assert "(1.7 cores)" in verdict.text  # 21 % of 8 cores
    table = next(b for b in section.blocks if isinstance(b, Table) and b.caption.startswith("The job's own"))
    ((node, host_mean, host_p95, job_mean, job_p95, cores, rss, workers, workers_cores),) = table.rows
    assert node == "algo-1" and 80 < host_mean < 90 and job_mean == pytest.approx(21.0)
    assert cores == "1.7 / 1.7" and rss == "2 GB" and workers == 2 and workers_cores == "0.8 / 0.8"


def test_a_job_that_uses_the_cpus_is_told_so(tmp_path: Path):
    _, section = _build(_busy_host_run(tmp_path / "run", job_pct=80.0, workers=0))
    (verdict,) = [b for b in section.blocks if isinstance(b, Verdict)]
    assert verdict.level == GOOD and "well utilized by the job" in verdict.text
    assert "used 80 % of the host's cores on average (6.4 cores)." in verdict.text
    table = next(b for b in section.blocks if isinstance(b, Table) and b.caption.startswith("The job's own"))
    assert table.rows[0][7:] == [0, "–"]  # no loader workers: no workers' CPU


def test_the_terminal_summary_says_whose_cpu_it_is(tmp_path: Path):
    from stallwatch.present.summary import summary_text

    text = summary_text(RunAnalysis(open_run(str(_busy_host_run(tmp_path / "run", job_pct=21.0)))))
    start = text.index("  algo-1: the job's own processes")
    line = " ".join(text[start:text.index("\n\n", start)].split())  # wrapped for the terminal: one paragraph
    assert "used 21% of the host's 8 cores on average (1.7 cores)" in line
    assert "busy mostly with other work, not the job" in line
    assert "RSS up to 2 GB" in line and "2 loader worker(s) using 10% (0.8 cores)" in line


def test_a_gpu_node_held_back_by_busy_cpus_says_whose_they_were():
    from stallwatch.analyze.job_usage import JobUsage, Share

    details = OverallSystemUsageDetails.from_json({"CPU": {"n1": _stats(90)}, "GPU": {"n1": _stats(50)}})
    others = JobUsage("n1", 8, Share(88.0, 90.0, 93.0, 7.0, 7.2), Share(20.0, 25.0, 30.0, 1.6, 2.0))
    v = node_verdict("n1", details, others)
    assert v is not None and v.level == ISSUE and "likely because of CPU bottlenecks" in v.text
    assert v.text.endswith("The job's own processes used 20 % of the host's cores on average (1.6 cores); other "
                           "work on node n1 used about 68 % more.")
    busy = JobUsage("n1", 8, Share(88.0, 90.0, 93.0, 7.0, 7.2), Share(80.0, 85.0, 90.0, 6.4, 6.8))
    assert node_verdict("n1", details, busy).text.endswith("used 80 % of the host's cores on average (6.4 cores).")


def test_too_few_snapshots_or_an_idle_host_say_nothing_of_whose_cpu():
    from stallwatch.analyze.job_usage import MIN_SNAPSHOTS, job_usage
    from stallwatch.analyze.usage import UsageStat

    def stats(count: int, host: float) -> list[UsageStat]:
        return [UsageStat("n1", "CPU total", "%", host, host, host, host, count),
                UsageStat("n1", "Job CPU", "%", 2.0, 2.0, 2.0, 2.0, count)]

    assert job_usage("n1", stats(MIN_SNAPSHOTS - 1, 60.0), 4) is None  # a job seen twice reads 0 %: not measured
    seen = job_usage("n1", stats(MIN_SNAPSHOTS, 60.0), 4)
    assert seen is not None and seen.mostly_others
    quiet = job_usage("n1", stats(MIN_SNAPSHOTS, 10.0), 4)
    assert quiet is not None and not quiet.mostly_others  # a host at 10 % was not busy, whoever used it
