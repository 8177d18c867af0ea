"""5. CPU bottlenecks: GPUs idle while a CPU core is busy (the CPUBottleneck rule's numbers and periods)."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.report.model import Section
from stallwatch.present.report.sections import _bottlenecks

KIND = _bottlenecks.Kind(rule="CPUBottleneck", title="CPU bottlenecks", id="cpu-bottlenecks", what="CPU",
                         busy_param="cpu_threshold", busy="the utilization of a CPU core")


def build(analysis: RunAnalysis) -> list[Section]:
    return _bottlenecks.build(analysis, KIND)
