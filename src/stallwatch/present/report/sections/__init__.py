"""The report's sections, in the order they appear: each module has `build(analysis: RunAnalysis) ->
list[Section]` (an empty list when it has nothing to show at all; a section that does not apply shows a
NotApplicable block instead of disappearing)."""

from __future__ import annotations

import importlib
from typing import Any

ORDER = (
    "findings",         # What to fix first: the verdict and the findings ranked by time at stake
    "comparison",       # with --baseline: this run against the baseline
    "cost",             # with a price per node-hour: the cost, what waiting cost, right-sizing advice
    "summary",          # 1. Training job summary
    "system_usage",     # 2. System usage statistics
    "framework",        # 3. Framework metrics summary (+ CPU / GPU operators)
    "rules",            # 4. Rules summary
    "timeline",         # beyond the seeds: system timeline with phases and flagged moments
    "heatmap",          # beyond the seeds: utilization heatmap (every core and GPU a row)
    "analysis",         # 5. Analyzing the training loop (or initialization): heading and which comes first
    "hang",             # 5. Hangs: stopped ranks, the one behind, their stacks (beyond the seeds)
    "steps",            # 5. Step duration analysis
    "gpu_utilization",  # 5. GPU utilization
    "load_balancing",   # 5. Workload balancing
    "dataloading",      # 5. Dataloading analysis
    "batch_size",       # 5. Batch size
    "cpu_bottlenecks",  # 5. CPU bottlenecks
    "io_bottlenecks",   # 5. I/O bottlenecks
    "gpu_memory",       # 5. GPU memory
    "memory",           # beyond the seeds: memory per step, per rank; the leak with its line; an OOM death
    "ranks",            # beyond the seeds: rank × step heatmaps of step time and data wait
    "nodes",            # beyond the seeds: node comparison (multi-node runs)
    "overhead",         # beyond the seeds: the cost of profiling itself
)


def section_modules() -> list[Any]:
    """The section modules that exist, in ORDER (a missing one is skipped, so sections land one by one)."""
    out = []
    for name in ORDER:
        try:
            out.append(importlib.import_module(f"{__name__}.{name}"))
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    return out
