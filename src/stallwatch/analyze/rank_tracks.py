"""One node's ranks side by side in time, as Perfetto draws a trace: a track per rank of the blocks of its steps'
phases (data wait, forward, backward, optimizer, DDP's exposed gradient sync), so a straggling or waiting rank
shows where one merged line of step times hides it. Few blocks are returned one by one; a range holding more
(zoomed out) is returned per rank and time bucket as each phase's share of the bucket's time — the answer's
size is bounded by the bucket count, never by the run's length."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze.steps import PHASES
from stallwatch.records import COLLECTIVE, DDP_SYNC, STEP

TRACK_KINDS = (*PHASES, DDP_SYNC)  # what a block is; DDP_SYNC: the `collective` events of that name
READ_KINDS = (STEP, *PHASES, COLLECTIVE)
MAX_BLOCKS = 3000  # drawn one by one up to this many (steps included); more are drawn per bucket
BUCKETS = 240
MAX_READ = 200_000  # events read at most for the whole run (more: the page asks to zoom in)


@dataclass(frozen=True)
class Block:
    rank: int
    kind: str  # a phase, DDP_SYNC or STEP (the step's own span, drawn as the track's background)
    start_us: int
    end_us: int
    step: int | None
    mode: str


@dataclass(frozen=True)
class RankTracks:
    node: str
    start_us: int | None
    end_us: int | None
    ranks: list[int]
    blocks: list[Block] = field(default_factory=list)  # when not `aggregated`
    aggregated: bool = False
    bucket_us: int = 0
    bucket_start_us: int = 0
    # when `aggregated`: rank -> kind -> share (0-1) of each bucket's time spent in that kind
    shares: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    total_blocks: int = 0
    zoom_in: bool = False  # the whole run holds too many events to read: a narrower range is drawn


def rank_tracks(node: str, events: pa.Table, start_us: int | None, end_us: int | None, *,
                limit: int = MAX_BLOCKS, buckets: int = BUCKETS) -> RankTracks:
    """`events`: framework rows (kind, name, rank, mode, step, start_us, end_us) of one node."""
    if events.num_rows == 0:
        return RankTracks(node, start_us, end_us, [])
    kind = events["kind"].cast(pa.string())
    sync = pc.fill_null(pc.and_(pc.equal(kind, COLLECTIVE), pc.equal(events["name"].cast(pa.string()), DDP_SYNC)), False)
    kind = pc.if_else(sync, pa.scalar(DDP_SYNC), kind)
    keep = pc.fill_null(pc.is_in(kind, pa.array([STEP, *TRACK_KINDS], pa.string())), False)
    events, kind = events.filter(keep), kind.filter(keep)
    if events.num_rows == 0:
        return RankTracks(node, start_us, end_us, [])
    encoded = pc.dictionary_encode(kind)
    encoded = encoded.combine_chunks() if isinstance(encoded, pa.ChunkedArray) else encoded
    names = np.array(encoded.dictionary.to_pylist(), dtype=object)  # a handful: codes are cheap to group by
    code = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    rank = events["rank"].to_numpy(zero_copy_only=False).astype(np.int64)
    start = events["start_us"].to_numpy(zero_copy_only=False).astype(np.int64)
    end = events["end_us"].to_numpy(zero_copy_only=False).astype(np.int64)
    ranks = sorted(int(r) for r in np.unique(rank))
    step_code = names.tolist().index(STEP) if STEP in names.tolist() else -1
    blocks = int((code != step_code).sum())
    if len(code) <= limit:
        kinds = names[code]
        steps = events["step"].to_pylist()
        modes = events["mode"].cast(pa.string()).to_pylist()
        out = [Block(int(rank[i]), str(kinds[i]), int(start[i]), int(end[i]), steps[i], str(modes[i]))
               for i in np.argsort(start, kind="stable")]
        return RankTracks(node, start_us, end_us, ranks, out, total_blocks=blocks)
    lo = int(start.min()) if start_us is None else int(start_us)
    hi = int(end.max()) if end_us is None else int(end_us)
    width = max(1, -(-(max(hi, lo + 1) - lo) // buckets))
    edges = width * np.arange(buckets + 1, dtype=np.int64)
    shares: dict[int, dict[str, list[float]]] = {r: {} for r in ranks}
    key = rank * len(names) + code
    order = np.argsort(key, kind="stable")  # by rank, then kind: each (rank, kind) a slice
    cuts = np.flatnonzero(np.diff(key[order])) + 1
    for rows in np.split(order, cuts):
        k = str(names[code[rows[0]]])
        if k in TRACK_KINDS:
            covered = _covered(start[rows] - lo, end[rows] - lo, edges)
            shares[int(rank[rows[0]])][k] = [round(float(v), 3) for v in np.clip(np.diff(covered) / width, 0.0, 1.0)]
    return RankTracks(node, start_us, end_us, ranks, aggregated=True, bucket_us=int(width), bucket_start_us=lo,
                      shares=shares, total_blocks=blocks)


def _covered(s: np.ndarray, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per time in `t`, the summed length of the intervals [s, e) before it (int64 offsets: exact):
    Σ clip(t - s, 0, e - s) = Σ_{s<t} (t - s) - Σ_{e<t} (t - e), from the sorted starts and ends."""
    s, e = np.sort(s), np.sort(np.maximum(e, s))
    cs = np.concatenate([[0], np.cumsum(s)])
    ce = np.concatenate([[0], np.cumsum(e)])
    ns = np.searchsorted(s, t, side="left")
    ne = np.searchsorted(e, t, side="left")
    return (ns * t - cs[ns]) - (ne * t - ce[ne])
