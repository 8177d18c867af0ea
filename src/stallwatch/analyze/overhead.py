"""What stallwatch cost the training processes, as they measured it themselves (`overhead` markers: each hook
timed its own work in short windows). Said where it is a material share of the loop: the step times include it,
so a loop of very short steps reads slower than it runs without stallwatch."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from stallwatch.timeutil import format_duration

MATERIAL = 0.02  # a share of the loop's time at which the hooks' cost is worth saying
MIN_WINDOW_NS = 100_000_000  # measured over less than this, a share says little


@dataclass(frozen=True)
class HookCost:
    """One rank's hook time (`own_ns`) and its event thread's CPU (`sender_ns`, which holds the interpreter's lock)
    within `window_ns` of its loop, over `calls` timed hook calls."""

    node: str
    rank: int
    own_ns: int
    window_ns: int
    calls: int
    sender_ns: int = 0

    @property
    def share(self) -> float:
        """The training process's time that was stallwatch's, in the windows."""
        return min(1.0, (self.own_ns + self.sender_ns) / self.window_ns) if self.window_ns > 0 else 0.0


def hook_costs(markers: pa.Table) -> list[HookCost]:
    """Per node and rank, its newest record (they are cumulative: the one measured over the longest window)."""
    best: dict[tuple[str, int], HookCost] = {}
    for row in markers.select(["node", "rank", "args"]).to_pylist():
        try:
            args = json.loads(row["args"] or "{}")
            cost = HookCost(str(row["node"]), int(row["rank"]), int(args["own_ns"]), int(args["window_ns"]),
                            int(args.get("calls", 0)), int(args.get("sender_ns", 0)))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # a record that does not read is not evidence of anything
        if min(cost.own_ns, cost.calls, cost.sender_ns) < 0 or cost.window_ns <= 0:
            continue
        key = (cost.node, cost.rank)
        if key not in best or cost.window_ns > best[key].window_ns:
            best[key] = cost
    return [best[k] for k in sorted(best)]


def notes(costs: list[HookCost]) -> list[str]:
    """One line when the hooks took a material share of some rank's loop (the highest share named)."""
    material = [c for c in costs if c.window_ns >= MIN_WINDOW_NS and c.share >= MATERIAL]
    if not material:
        return []
    top = max(material, key=lambda c: c.share)
    where = f"rank {top.rank} on {top.node}" if len(material) == 1 else \
        f"{len(material)} of {len(costs)} ranks (most: rank {top.rank} on {top.node})"
    per_call = top.own_ns / top.calls / 1000 if top.calls else 0.0
    return [f"stallwatch took at least {_pct(top.share)} of the training process's time on {where} ({per_call:.1f} "
            f"µs per hook call, timed in short windows, {format_duration(top.window_ns / 1e9)} in all; with its event "
            "thread): the step times include it, so this loop runs faster without stallwatch. Its steps are short "
            "enough for a few µs a step to matter"]


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %" if share >= 0.1 else f"{share * 100:.1f} %"
