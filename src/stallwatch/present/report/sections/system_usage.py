"""2. System usage statistics: per node and metric the OverallSystemUsage rule's max, p99, p95, p50 and min,
the verdict on each node (underutilized, CPU-bound, well utilized), and how busy each core and GPU was."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stallwatch import catalogue
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.job_usage import JobUsage, Share
from stallwatch.analyze.rules.system_usage import OverallSystemUsageDetails, UsageStats
from stallwatch.present.report.breakdowns import device_bars
from stallwatch.present.report.model import (
    GOOD,
    INFO,
    ISSUE,
    WARN,
    Block,
    Chart,
    NotApplicable,
    Paragraph,
    Section,
    Table,
    Verdict,
)
from stallwatch.records import (
    CPU_UTIL,
    DISK,
    DISK_READ_BPS,
    DISK_WRITE_BPS,
    GPU_MEM_UTIL,
    GPU_UTIL,
    NET,
    NET_RX_BPS,
    NET_TX_BPS,
)
from stallwatch.units import format_value

SECTION_ID = "system-usage"
TITLE = "System usage statistics"
RULE = "OverallSystemUsage"
INTRO = ("The following table shows statistics of resource utilization per worker (node), such as the total CPU and "
         "GPU utilization, and the memory utilization on CPU and GPU. The table also includes the total I/O wait time "
         "and the total amount of data sent and received over the network per second. The table shows min and max "
         "values as well as p99, p95 and p50 percentiles.")
STATS = ("max", "p99", "p95", "p50", "min")
METRICS = ("CPU", "CPU memory", "GPU", "GPU memory", "I/O", "Network")  # the rule's names, in its order
UNITS = {"CPU": "%", "CPU memory": "%", "GPU": "%", "GPU memory": "%", "I/O": "% (I/O wait)", "Network": "MB/s"}
MB = 1e6
RATES = {m: catalogue.metric(device, m).track for device, m in  # type: ignore[union-attr]
         ((DISK, DISK_READ_BPS), (DISK, DISK_WRITE_BPS), (NET, NET_RX_BPS), (NET, NET_TX_BPS))}
BUSY = 70.0  # the seeds' threshold for "well utilized" (p95 / p50 above it)
SATURATED = 90.0  # a core this busy (p95) is the limit, whatever the total says (CPUBottleneck's cpu_threshold)


def build(analysis: RunAnalysis) -> list[Section]:
    result = analysis.rule(RULE)
    if result is None or not result.applies:
        why = (result.message if result is not None else "") or "the rule's result is missing"
        return [Section(SECTION_ID, TITLE, [NotApplicable(f"No system usage statistics: {why}.")])]
    details = OverallSystemUsageDetails.from_json(result.details)
    nodes = sorted({n for m in METRICS for n in details.metric(m)} | set(details.devices))
    jobs = {node: analysis.job_usage(node) for node in nodes}
    blocks: list[Block] = [v for node in nodes if (v := node_verdict(node, details, jobs[node])) is not None]
    blocks.append(Paragraph(INTRO))
    rows = []
    for node in nodes:
        for metric in METRICS:
            stats = details.metric(metric).get(node)
            if stats:
                scale = MB if metric == "Network" else 1.0
                rows.append([node, metric, UNITS[metric], *(_num(v, scale) for v in _values(stats))])
    blocks.append(Table(["node", "metric", "unit", *STATS], rows))
    own = job_table([j for j in jobs.values() if j is not None])
    if own is not None:  # whose CPU it was, right under the host's
        blocks += [Paragraph(JOB_INTRO), own]
    devices = details.devices
    # each value in the unit that reads (1.2 kB/s, 35 MB/s), not all in MB/s (0.0012 MB/s)
    rates = [[node, RATES[metric], *(format_value(v, "B/s") for v in _values(stats))]
             for node in nodes for dev in (devices.get(node) or {}).values()
             for metric, stats in dev.items() if metric in RATES]
    if rates:
        blocks.append(Table(["node", "throughput", *STATS], rates, "Disk and network throughput"))
    for node in nodes:
        chart = _device_chart(node, devices.get(node) or {})
        if chart is not None:
            blocks.append(chart)
    return [Section(SECTION_ID, TITLE, blocks)]


JOB_INTRO = ("The host's CPU above counts every process on the node. The job's own processes (its main processes "
             "and their data-loader workers, as the sampler found them) used this much of it: a host busy with "
             "other work is not the job using its CPUs. CPU is % of all the host's cores; in cores, how many of "
             "them it kept busy.")


def job_table(jobs: list[JobUsage]) -> Table | None:
    """Per node, the job's CPU beside the host's, its memory (RSS) and its loader workers."""
    if not jobs:
        return None

    def pct(share: Share | None) -> tuple[Any, Any]:
        return (None, None) if share is None else (round(share.mean_pct), round(share.p95_pct))  # whole %

    def cores(share: Share | None) -> str:
        if share is None or share.mean_cores is None or share.p95_cores is None:
            return "–"
        return f"{share.mean_cores:.1f} / {share.p95_cores:.1f}"

    rows = [[j.node, *pct(j.host_cpu), *pct(j.job_cpu), cores(j.job_cpu),
             format_value(j.rss_max_bytes, "B") if j.rss_max_bytes is not None else "–",
             j.workers_max if j.workers_max is not None else "–",
             cores(j.workers_cpu) if j.workers_cpu is not None else "–"] for j in jobs]
    return Table(["node", "host CPU mean %", "host CPU p95 %", "job CPU mean %", "job CPU p95 %",
                  "job cores mean / p95", "job RSS max", "loader workers", "workers' cores mean / p95"],
                 rows, "The job's own processes beside the host")


def _job_text(node: str, job: JobUsage | None) -> str:
    """Whose CPU it is: the job's processes' share of the host's, in words."""
    if job is None:
        return ""
    in_cores = f" ({job.job_cpu.mean_cores:.1f} cores)" if job.job_cpu.mean_cores is not None else ""
    text = f" The job's own processes used {job.job_cpu.mean_pct:.0f} % of the host's cores on average{in_cores}"
    if job.mostly_others and job.others_pct is not None:
        return text + f"; other work on node {node} used about {job.others_pct:.0f} % more."
    return text + "."


def _values(stats: UsageStats) -> tuple[float | None, ...]:
    """The statistics in STATS' order."""
    return stats.max, stats.p99, stats.p95, stats.p50, stats.min


def _num(value: Any, scale: float = 1.0) -> float | None:
    return None if value is None else float(value) / scale


def node_verdict(node: str, details: OverallSystemUsageDetails, job: JobUsage | None = None) -> Verdict | None:
    """The seeds' per-node verdict, from the 95th and 50th percentiles of total CPU and (mean) GPU utilization;
    a CPU-only node is judged on its CPUs alone. With the job's own usage, it says whose CPU it was: a host busy
    with other work is not the job using its CPUs."""
    verdict = _host_verdict(node, details, job)
    if verdict is None or job is None:
        return verdict
    return Verdict(verdict.text + _job_text(node, job), verdict.level)


def _host_verdict(node: str, details: OverallSystemUsageDetails, job: JobUsage | None) -> Verdict | None:
    cpu = details.cpu.get(node)
    gpu = details.gpu.get(node)
    if gpu:
        g95, g50 = gpu.p95, gpu.p50
        if g95 is None or g50 is None:
            return None
        if cpu and cpu.p95 is not None and g95 < BUSY and cpu.p95 < BUSY:
            return Verdict(f"The 95th percentile of the total GPU utilization on node {node} is only {g95:.0f} % and "
                           f"that of the total CPU utilization only {cpu.p95:.0f} %: node {node} is underutilized. "
                           "You may want to consider switching to a smaller instance type or increasing the batch "
                           f"size.{_one_busy_core(node, details)}", WARN)
        if cpu and cpu.p95 is not None and g95 < BUSY and cpu.p95 > BUSY:
            return Verdict(f"The 95th percentile of the total GPU utilization on node {node} is only {g95:.0f} %, "
                           f"while that of the total CPU utilization is {cpu.p95:.0f} %: the GPUs on node {node} "
                           "are underutilized, likely because of CPU bottlenecks (see the CPU bottlenecks and data "
                           "loading analyses).", ISSUE)
        if g50 > BUSY:
            return Verdict(f"The median total GPU utilization on node {node} is {g50:.0f} %: the GPUs on node {node} "
                           "are well utilized.", GOOD)
        cpu_text = f", the median total CPU utilization {cpu.p50:.0f} %" if cpu and cpu.p50 is not None else ""
        return Verdict(f"The median total GPU utilization on node {node} is {g50:.0f} %{cpu_text}.", INFO)
    if cpu and cpu.p95 is not None:
        if cpu.p95 > BUSY and job is not None and job.mostly_others:
            return Verdict(f"The 95th percentile of the total CPU utilization on node {node} (every process on the "
                           f"host) is {cpu.p95:.0f} %, but the CPUs were busy mostly with other work on the host, not "
                           "with the job.", WARN)
        if cpu.p95 > BUSY:
            return Verdict(f"The 95th percentile of the total CPU utilization on node {node} is {cpu.p95:.0f} %: "
                           f"the CPUs on node {node} are well utilized{' by the job' if job is not None else ''}.",
                           GOOD)
        return Verdict(f"The 95th percentile of the total CPU utilization on node {node} is only {cpu.p95:.0f} %: "
                       f"node {node} is underutilized; a smaller instance would do.{_one_busy_core(node, details)}",
                       WARN)
    return None


def _one_busy_core(node: str, details: OverallSystemUsageDetails) -> str:
    """When the total is low but one core is saturated, the job is limited by one process (often the main one
    preparing batches): a smaller instance would not help, more data-loader workers might."""
    cores = [(d, p95) for d, m in (details.devices.get(node) or {}).items()
             if d.startswith("cpu") and d[3:].isdigit() and CPU_UTIL in m and (p95 := m[CPU_UTIL].p95) is not None]
    if len(cores) < 2:
        return ""
    device, p95 = max(cores, key=lambda c: c[1])
    if p95 < SATURATED:
        return ""
    return (f" However, core {device} was saturated (95th percentile {p95:.0f} %): the job may be held back by one "
            "busy process, such as a main process that loads data itself; check the data loading analysis before "
            "choosing a smaller instance.")


def _device_chart(node: str, devices: Mapping[str, Mapping[str, UsageStats]]) -> Chart | None:
    """Per core and per GPU (utilization, then memory): the median as a bar, p95 and max as markers."""
    names, stats = [], []
    for device, metrics in devices.items():
        if CPU_UTIL in metrics and device.startswith("cpu"):
            names.append(device)
            stats.append(metrics[CPU_UTIL].as_stats())
    for device, metrics in devices.items():
        if GPU_UTIL in metrics:
            names.append(device)
            stats.append(metrics[GPU_UTIL].as_stats())
    for device, metrics in devices.items():
        if GPU_MEM_UTIL in metrics:
            names.append(f"{device} mem")
            stats.append(metrics[GPU_MEM_UTIL].as_stats())
    if not names:
        return None
    return Chart(device_bars(names, stats, title=f"Utilization per core and GPU on node {node}"),
                 f"Utilization per device on node {node}")
