"""The sampler's running counts of what the job sent (steps per rank and mode, the loop's span, phase time, a
progress curve, what became of profiling windows), written to `live/<node>.json` every second while they change:
the live dashboard's numbers then trail the job by about a second, not by a flush interval. Constant memory:
a few counters per rank and mode, a bounded progress curve, the newest notices."""

from __future__ import annotations

import json
import math
import time
from collections import deque
from typing import Any

from stallwatch import records as r
from stallwatch.log import warn_once
from stallwatch.records import BACKWARD, DATA_WAIT, FORWARD, MODES, OPTIMIZER, STEP, UNTIMED
from stallwatch.store.live_status import MAX_NOTICES, MAX_PROGRESS, MAX_SNAPSHOTS, write_live

WRITE_EVERY_S = 0.9  # on local disk; a bucket gets them every flush interval (each write is a request)
PHASES = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER)
# The newest snapshots' node-wide series (not per core): the live charts' edge, ahead of the next flush.
SNAPSHOT_METRICS = {r.CPU_UTIL, r.CPU_IOWAIT, r.MEM_UTIL, r.NET_RX_BPS, r.NET_TX_BPS, r.GPU_UTIL, r.GPU_MEM_UTIL}


class LiveCounts:
    def __init__(self, node: str, *, every_s: float = WRITE_EVERY_S) -> None:
        self.node = node
        self.every_s = every_s
        self._ranks: dict[int, dict[str, Any]] = {}
        self._step_us: dict[str, int] = {}
        self._phase_us: dict[str, dict[str, int]] = {}
        self._progress: list[tuple[int, int]] = []
        self._notices: deque[dict[str, Any]] = deque(maxlen=MAX_NOTICES)
        self._columns: list[str] = []
        self._picked: list[int] = []
        self._keys: Any = None
        self._snapshots: deque[list[Any]] = deque(maxlen=MAX_SNAPSHOTS)
        self._total = 0
        self._changed = False
        self._written = 0.0
        self._failed = False

    def add(self, rank: int, events: list[Any]) -> None:
        """One rank's new events (FrameworkEvent records)."""
        r = self._ranks.get(rank)
        if r is None:
            r = self._ranks[rank] = {"rank": rank, "pid": None, "steps": {}, "last_step": {}, "first_us": None,
                                     "last_us": None}
        for e in events:
            kind, mode = e.kind, e.mode if e.mode in MODES else None
            if r["pid"] is None:
                r["pid"] = e.pid
            if kind == STEP and mode is not None:
                r["steps"][mode] = r["steps"].get(mode, 0) + 1
                if isinstance(e.step, int):
                    r["last_step"][mode] = max(r["last_step"].get(mode, e.step), e.step)
                r["first_us"] = e.start_us if r["first_us"] is None else min(r["first_us"], e.start_us)
                r["last_us"] = e.end_us if r["last_us"] is None else max(r["last_us"], e.end_us)
                self._step_us[mode] = self._step_us.get(mode, 0) + max(e.end_us - e.start_us, 0)
                self._total += 1
                self._changed = True
            elif kind in PHASES and mode is not None:
                per = self._phase_us.setdefault(mode, {})
                per[kind] = per.get(kind, 0) + max(e.end_us - e.start_us, 0)
            elif kind == UNTIMED and mode is not None:  # steps counted, not timed (sampled step rates)
                try:
                    n = int(json.loads(e.args or "{}").get("steps", 0))
                except (ValueError, TypeError, AttributeError):
                    n = 0
                if n > 0:
                    r["steps"][mode] = r["steps"].get(mode, 0) + n
                    r["last_us"] = e.end_us if r["last_us"] is None else max(r["last_us"], e.end_us)
                    self._total += n
                    self._changed = True

    def snapshot(self, ts: int, keys: list[Any], values: Any) -> None:
        """A system snapshot as the sampler took it (`keys`: its MetricKeys); its node-wide series are kept."""
        if keys is not self._keys:
            self._keys = keys
            self._picked = [i for i, k in enumerate(keys) if k.metric in SNAPSHOT_METRICS and (
                k.device in (r.CPU, r.MEMORY, r.NET) or k.device.startswith("gpu"))]
            self._columns = [keys[i].column for i in self._picked]
            self._snapshots.clear()
        row: list[Any] = [int(ts)]
        for i in self._picked:
            v = values[i]
            v = float(v) if v is not None else math.nan
            row.append(round(v, 3) if math.isfinite(v) else None)
        self._snapshots.append(row)
        self._changed = True

    def notice(self, rank: int, notice: dict[str, Any], now_us: int) -> None:
        """What the job did with a profiling window (`stallwatch.torch.windows`: started, captured, past…)."""
        self._notices.append({"rank": rank, "layer": str(notice.get("layer", ""))[:40],
                              "range": str(notice.get("range", ""))[:200],
                              "outcome": str(notice.get("outcome", ""))[:40],
                              "message": str(notice.get("message", ""))[:500], "at_us": now_us})
        self._changed = True

    def tick(self, sink: Any, now_us: int, *, force: bool = False, running: bool = True) -> None:
        """Write the counts when they changed and the write period passed (or `force`: the last write)."""
        now = time.monotonic()
        if not force and (not self._changed or now - self._written < self.every_s):
            return
        self._written = now
        self._changed = False
        if not self._progress or self._progress[-1][1] != self._total:
            self._progress.append((now_us, self._total))
            if len(self._progress) > MAX_PROGRESS:  # every other point: the whole run's shape, at half the detail
                self._progress = self._progress[::2] + ([self._progress[-1]] if len(self._progress) % 2 == 0 else [])
        try:
            write_live(sink, self.node, self.document(now_us, running))
            self._failed = False
        except Exception as exc:  # counts are a convenience: never a reason to stop sampling
            if not self._failed:
                warn_once(f"live-json-{type(exc).__name__}", "cannot write the live counts (%s: %s)",
                          type(exc).__name__, exc)
            self._failed = True

    def document(self, now_us: int, running: bool = True) -> dict[str, Any]:
        return {"node": self.node, "written_us": now_us, "running": running,
                "ranks": [dict(r) for _, r in sorted(self._ranks.items())],
                "progress": [list(p) for p in self._progress], "step_us": dict(self._step_us),
                "phase_us": {m: dict(v) for m, v in self._phase_us.items()}, "notices": list(self._notices),
                "snapshots": {"columns": list(self._columns), "rows": [list(x) for x in self._snapshots]}}
