"""Per rank and mode: how many steps, how long they took, which was slowest, and where a training step's
time went (waiting for data, forward, backward, optimizer). What the run summary prints; the rules and the
report go further."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.records import BACKWARD, DATA_WAIT, FORWARD, MODES, OPTIMIZER, STEP

PHASES = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER)


@dataclass(frozen=True)
class StepStat:
    node: str
    rank: int
    mode: str
    steps: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    slowest_step: int
    # share of the mode's total step time spent in each phase, in %
    phase_pct: dict[str, float] = field(default_factory=dict)


def step_stats(events: pa.Table) -> list[StepStat]:
    """`events`: `Run.framework()` (at least the step and phase kinds)."""
    if events.num_rows == 0:
        return []
    out = []
    kinds = events["kind"].cast(pa.string())
    modes = events["mode"].cast(pa.string())
    nodes = events["node"].cast(pa.string())
    duration = pc.subtract(events["end_us"], events["start_us"]).to_numpy(zero_copy_only=False)
    for node in sorted(set(nodes.to_pylist())):
        at_node = pc.equal(nodes, node)
        for rank in sorted(set(events.filter(at_node)["rank"].to_pylist())):
            mine = pc.and_(at_node, pc.equal(events["rank"], rank))
            for mode in MODES:
                sel = pc.and_(mine, pc.equal(modes, mode))
                is_step = pc.and_(sel, pc.equal(kinds, STEP)).to_numpy(zero_copy_only=False)
                if not is_step.any():
                    continue
                d = duration[is_step] / 1000.0
                numbers = events["step"].to_numpy(zero_copy_only=False)[is_step]
                total = d.sum()
                phases = {}
                for phase in PHASES:
                    mask = pc.and_(sel, pc.equal(kinds, phase)).to_numpy(zero_copy_only=False)
                    if mask.any():
                        phases[phase] = 100.0 * duration[mask].sum() / 1000.0 / total if total > 0 else 0.0
                out.append(StepStat(node, int(rank), mode, int(is_step.sum()), float(np.percentile(d, 50)),
                                    float(np.percentile(d, 95)), float(d.max()), int(numbers[int(d.argmax())]),
                                    phases))
    return out
