"""5. I/O bottlenecks: GPUs idle while a CPU core waits on I/O (the IOBottleneck rule's numbers and periods)."""

from __future__ import annotations

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.report.model import Section
from stallwatch.present.report.sections import _bottlenecks

KIND = _bottlenecks.Kind(rule="IOBottleneck", title="I/O bottlenecks", id="io-bottlenecks", what="I/O",
                         busy_param="io_threshold", busy="the I/O wait of a CPU core")


def build(analysis: RunAnalysis) -> list[Section]:
    return _bottlenecks.build(analysis, KIND)
