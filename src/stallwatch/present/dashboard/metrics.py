"""`/metrics` in the Prometheus text format, for the runs being served that are still running: per node the
utilization the analysis summarises, per rank the step time and the data-wait share, per rule how often it
fired. Labels stay bounded (run, node, rank, mode, metric, rule — never a step number); these are summaries
over the run so far, so chart spikes with `max_over_time` over the p95/max series."""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.records import DATA_WAIT


class _RunsCollector(Collector):
    def __init__(self, runs: Iterable[tuple[str, RunAnalysis]]) -> None:
        self._runs = list(runs)

    def collect(self) -> Iterable[Any]:
        usage = GaugeMetricFamily("stallwatch_node_usage", "Node utilization over the run so far, by statistic",
                                  labels=["run", "node", "metric", "unit", "stat"])
        step = GaugeMetricFamily("stallwatch_step_time_seconds", "Step time over the run so far",
                                 labels=["run", "node", "rank", "mode", "quantile"])
        steps = GaugeMetricFamily("stallwatch_steps", "Steps recorded", labels=["run", "node", "rank", "mode"])
        wait = GaugeMetricFamily("stallwatch_data_wait_ratio", "Share of step time waiting for data",
                                 labels=["run", "node", "rank", "mode"])
        fired = GaugeMetricFamily("stallwatch_rule_triggered", "How often each rule fired so far (0: not fired)",
                                  labels=["run", "rule", "status"])
        for run_id, analysis in self._runs:
            for node in analysis.nodes:
                for u in analysis.usage(node):
                    for stat in ("mean", "p50", "p95", "max"):
                        usage.add_metric([run_id, node, u.label, u.unit, stat], float(getattr(u, stat)))
            for s in analysis.step_stats():
                where = [run_id, s.node, str(s.rank), s.mode]
                steps.add_metric(where, s.steps)
                step.add_metric([*where, "0.5"], s.p50_ms / 1000)
                step.add_metric([*where, "0.95"], s.p95_ms / 1000)
                if DATA_WAIT in s.phase_pct:
                    wait.add_metric(where, s.phase_pct[DATA_WAIT] / 100)
            for r in analysis.rule_results:
                fired.add_metric([run_id, r.name, r.status], r.triggered)
        yield from (usage, step, steps, wait, fired)


def exposition(runs: Iterable[tuple[str, RunAnalysis]]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_RunsCollector(runs))
    return generate_latest(registry)
