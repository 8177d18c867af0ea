"""What the dashboard's per-rank tracks cost the server and the page, beside what the Nodes view already asked
for the same range (the framework timeline's `events_window`, the baseline), for ranges of growing size: a node of
8 ranks, steps of 100 ms with their four phases and DDP's exposed all-reduce. Each answer is computed once per
change of the run and shared by every client (answers.py), so this is the server's work per change.

Run: python benchmarks/dashboard_rank_tracks.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import machine, table  # noqa: E402

from stallwatch.analyze.rank_tracks import rank_tracks  # noqa: E402
from stallwatch.analyze.step_window import events_window  # noqa: E402
from stallwatch.present.dashboard.documents import events_doc, tracks_doc  # noqa: E402
from stallwatch.records import COLLECTIVE, DDP_SYNC, TRAIN  # noqa: E402
from tests.analyze.rules._fw_gen import MS, T0, FwGen  # noqa: E402

RANKS = 8


def node_events(steps: int):
    gen = FwGen()
    for rank in range(RANKS):
        starts, _ = gen.steps(rank=rank, n=steps, step_us=100 * MS, seed=rank)
        gen.events("algo-1", rank, COLLECTIVE, DDP_SYNC, TRAIN, np.arange(steps), starts + 80 * MS, starts + 90 * MS)
    return gen.table()


def best(fn, repeat: int = 3) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    rows = []
    for steps in (50, 500, 5_000, 25_000):
        events = node_events(steps)
        lo, hi = T0, T0 + steps * 101 * MS
        base = best(lambda: events_window(events, lo, hi))
        new = best(lambda: rank_tracks("algo-1", events, lo, hi))
        doc = tracks_doc(rank_tracks("algo-1", events, lo, hi))
        base_bytes = len(json.dumps(events_doc("algo-1", events_window(events, lo, hi))))
        rows.append([f"{events.num_rows:,}", "blocks" if not doc["aggregated"] else f"{len(doc['shares'])}×buckets",
                     f"{base * 1e3:.1f}", f"{new * 1e3:.1f}", f"{base_bytes / 1e3:.0f}", f"{len(json.dumps(doc)) / 1e3:.0f}"])
    print(f"dashboard rank tracks, {RANKS} ranks ({machine()})")
    print(table(["events in range", "tracks as", "events_window ms (baseline)", "rank_tracks ms", "events KB",
                 "tracks KB"], rows))


if __name__ == "__main__":
    main()
