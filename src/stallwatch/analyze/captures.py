"""The automatic captures firing rules asked for (escalations/), each with what became of it: stored (a profiling
window of its layers holds its time), lost (the run ended and none does: the job was killed or crashed before the
window was written), or pending (the run goes on). A capture asked for is not a capture stored."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

STORED = "stored"
LOST = "lost"
PENDING = "pending"
# A window starts at the job's first step boundary after the capture's start, and a time window that began
# a little early (a step that straddles it) still counts.
EARLY_US = 1_000_000


@dataclass(frozen=True)
class Capture:
    """One escalation record and its fate."""

    rule: str
    start_us: int
    end_us: int | None
    layers: list[str]
    reason: str
    status: str  # STORED, LOST or PENDING
    windows: list[str] = field(default_factory=list)  # the stored windows' paths in the run

    @property
    def why(self) -> str:
        """The status in words, for the report."""
        if self.status == STORED:
            return f"stored ({len(self.windows)} window{'s' if len(self.windows) != 1 else ''})"
        if self.status == LOST:
            return "lost: never stored (the job ended, killed or crashed, before the capture was written)"
        return "pending: the run goes on"


def capture_fates(escalations: Iterable[Mapping[str, Any]], windows: Iterable[Mapping[str, Any]], *,
                  finished: bool) -> list[Capture]:
    """Each escalation record (as `run_files.read_escalations` gives them) with its fate; `windows` are the run's
    stored profiling windows (`Run.profiles()`), `finished` whether every node of the run has ended."""
    stored = [w for w in windows if isinstance(w.get("start_us"), int)]
    out = []
    for e in escalations:
        start, end = e.get("start_us"), e.get("end_us")
        if not isinstance(start, int):
            continue
        layers = [x for x in (e.get("layers") or []) if isinstance(x, str)]
        until = end if isinstance(end, int) else start
        held = [str(w.get("path", "")) for w in stored
                if w.get("layer") in layers and start - EARLY_US <= w["start_us"] <= until]
        status = STORED if held else (LOST if finished else PENDING)
        out.append(Capture(str(e.get("rule", "")), start, end if isinstance(end, int) else None, layers,
                           str(e.get("reason", "")), status, held))
    return out
