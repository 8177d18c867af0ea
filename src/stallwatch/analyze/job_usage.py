"""The job's own share of a node beside the host-wide figures: its processes' CPU (% of the host's cores and in
cores), their memory (RSS) and its data-loader workers. A host busy with other work is not the job using the
CPUs: the report and the terminal say whose CPU is busy from this."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stallwatch import catalogue
from stallwatch import records as r
from stallwatch.analyze.usage import UsageStat

OTHERS_SHARE = 0.5  # the job used less than half of what the host's CPUs did: the rest was other work
BUSY_HOST = 25.0  # % of the host: below it the host was not busy, whoever used it
# Snapshots of the job's processes needed to say anything: a process's first reading has no CPU yet (no interval
# to measure), so a job seen twice reads "0 %" whatever it did.
MIN_SNAPSHOTS = 4


def _label(device: str, metric: str) -> str:
    entry = catalogue.metric(device, metric)
    assert entry is not None, (device, metric)
    return entry.label


HOST_CPU, JOB_CPU = _label(r.CPU, r.CPU_UTIL), _label(r.PROC, r.PROC_CPU_UTIL)
JOB_RSS, WORKERS, WORKERS_CPU = (_label(r.PROC, r.PROC_RSS_BYTES), _label(r.PROC, r.WORKERS_ALIVE),
                                 _label(r.PROC, r.WORKERS_CPU_UTIL))


@dataclass(frozen=True)
class Share:
    """A CPU figure as % of the host's cores and, when the cores are known, in cores."""
    mean_pct: float
    p95_pct: float
    max_pct: float
    mean_cores: float | None = None
    p95_cores: float | None = None


@dataclass(frozen=True)
class JobUsage:
    """One node: the host's CPU and the job's (its process tree: main processes and loader workers), the job's
    RSS, its loader workers (most alive at once) and their CPU."""
    node: str
    cores: int | None
    host_cpu: Share | None
    job_cpu: Share
    rss_mean_bytes: float | None = None
    rss_max_bytes: float | None = None
    workers_max: int | None = None
    workers_cpu: Share | None = None

    @property
    def others_pct(self) -> float | None:
        """What the host's CPUs did beyond the job's processes, mean % of the host (other work, the kernel)."""
        return None if self.host_cpu is None else max(0.0, self.host_cpu.mean_pct - self.job_cpu.mean_pct)

    @property
    def mostly_others(self) -> bool:
        """The host's CPUs were busy mostly with work other than the job's."""
        return (self.host_cpu is not None and self.host_cpu.mean_pct >= BUSY_HOST
                and self.job_cpu.mean_pct < OTHERS_SHARE * self.host_cpu.mean_pct)


def job_usage(node: str, stats: Sequence[UsageStat], cores: int | None) -> JobUsage | None:
    """From the node's usage statistics (`RunAnalysis.usage`); None when the sampler saw no job processes, or saw
    them too rarely to measure their CPU."""
    by = {s.label: s for s in stats if s.node == node and s.count}
    job = by.get(JOB_CPU)
    if job is None or job.count < MIN_SNAPSHOTS:
        return None
    rss, workers, wcpu = by.get(JOB_RSS), by.get(WORKERS), by.get(WORKERS_CPU)
    job_share = _share(job, cores)
    assert job_share is not None
    return JobUsage(node, cores, _share(by.get(HOST_CPU), cores), job_share,
                    rss.mean if rss else None, rss.max if rss else None,
                    int(round(workers.max)) if workers else None,
                    _share(wcpu, cores) if wcpu and workers and workers.max > 0 else None)


def _share(stat: UsageStat | None, cores: int | None) -> Share | None:
    if stat is None:
        return None
    in_cores = (lambda pct: pct * cores / 100.0) if cores else (lambda pct: None)
    return Share(stat.mean, stat.p95, stat.max, in_cores(stat.mean), in_cores(stat.p95))
