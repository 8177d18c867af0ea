"""The time each step's training thread waited for a CPU (its run-queue delay, `runq_us` in the step's args),
taken out of what the rules judge as the job's own: a step slowed by another process, a container's CPU limit or
a hypervisor's steal is not a slow step of the job's making, and a fetch interrupted by them is not a data
stall (CPUContention names that time instead). Runs recorded without it read as no delay."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.records import STEP

if TYPE_CHECKING:
    from stallwatch.analyze.framework_frame import FrameworkColumns

RUNQ_PATTERN = r'"runq_us":\s*(?P<runq>\d{1,15})\D'  # at most 15 digits: a run directory is untrusted
WAIT_RUNQ_PATTERN = r'"wait_runq_us":\s*(?P<runq>\d{1,15})\D'  # of it, the part in the step's opening wait
PEER_RUNQ_PATTERN = r'"peer_runq_us":\s*(?P<runq>\d{1,15})\D'  # the largest of its native peers' (intra-op pool)


def runq_column(cols: FrameworkColumns, pattern: str = RUNQ_PATTERN, missing: int = 0) -> np.ndarray:
    """Per row of a FrameworkColumns (analyze/framework_frame.py), a step's run-queue delay in µs read by `pattern`
    (`missing` where the row is not a step or its args do not say); decoded once per table and shared by the
    rules that ask."""
    cache = f"_runq_{pattern}_{missing}"
    cached = cols.__dict__.get(cache)
    if cached is not None:
        return cached
    out = np.full(cols.n, missing, np.int64)
    rows = np.flatnonzero(cols.kind_is(STEP))
    if rows.size and "args" in cols.table.column_names:
        args = cols.table["args"].take(pa.array(rows))
        found = pc.struct_field(pc.extract_regex(args, pattern), [0])
        out[rows] = pc.fill_null(pc.cast(found, pa.int64()), missing).to_numpy(zero_copy_only=False)
    cols.__dict__[cache] = out
    return out


def step_runq(cols: FrameworkColumns, rows: np.ndarray) -> np.ndarray:
    """The run-queue delay (µs) of the step rows `rows`, at most each step's duration."""
    runq = np.maximum(runq_column(cols, missing=-1)[rows], 0)  # the one decoding CPUContention counts measured by
    return np.minimum(runq, np.maximum(cols.end[rows] - cols.start[rows], 0))


def wait_runq(cols: FrameworkColumns, rows: np.ndarray) -> np.ndarray:
    """Of the step rows' run-queue delay, the part measured inside the wait that opened the step (µs); -1 where it
    was not measured (no DataLoader wait first, or a run recorded before it was)."""
    return runq_column(cols, WAIT_RUNQ_PATTERN, -1)[rows]


def peer_runq(cols: FrameworkColumns, rows: np.ndarray) -> np.ndarray:
    """The largest run-queue delay (µs) of the step rows' native peer threads (the intra-op pool the training thread
    waits for at a barrier), at most each step's duration; 0 where it was not read."""
    return np.minimum(runq_column(cols, PEER_RUNQ_PATTERN)[rows], np.maximum(cols.end[rows] - cols.start[rows], 0))


def own_time(dur: np.ndarray, runq: np.ndarray) -> np.ndarray:
    """Each step's own time: its duration less the time its training thread waited for a CPU."""
    return np.maximum(dur - np.minimum(runq, dur), 0)


def own_waits(dur: np.ndarray, wait: np.ndarray, runq: np.ndarray,
              in_wait: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps' own time, their wait for data as a share of it, and the least of their wait that was the loader's.
    Where the delay inside the wait was measured (`in_wait` ≥ 0, see `wait_runq`) the wait loses exactly that: a
    sleeping read is never runnable, so a busy machine does not shrink it. Elsewhere it is spread over the step (the
    share waiting is the measured one), and a stall must be long even if every bit of the delay fell in its wait
    (a 0.1 ms fetch preempted for 10 ms is not a slow read)."""
    runq = np.minimum(runq, dur)
    own = dur - runq
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = np.where(dur > 0, wait - (runq * wait) // np.maximum(dur, 1), wait)
    floor = np.maximum(wait - runq, 0)
    if in_wait is not None:
        measured = in_wait >= 0
        exact = np.maximum(wait - np.minimum(np.maximum(in_wait, 0), runq), 0)
        spread, floor = np.where(measured, exact, spread), np.where(measured, exact, floor)
    return own, np.minimum(np.maximum(spread, 0), own), floor


def others_share(node_cpu: np.ndarray, job_cpu: np.ndarray) -> np.ndarray:
    """Per snapshot, the share of the node's busy CPU that was not the job's (0 where either is unknown): how much
    of a wait for a CPU other processes caused. The job's own threads and workers outnumbering its cores are its
    own doing, and stay in what the rules judge."""
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(node_cpu > 0, (node_cpu - job_cpu) / node_cpu, 0.0)
    return np.clip(np.nan_to_num(share, nan=0.0), 0.0, 1.0)


def workers_delay(start: np.ndarray, dur: np.ndarray, snap_ts: np.ndarray, delay_ms_per_s: np.ndarray) -> np.ndarray:
    """Per step (µs), how much its batch was held back by loader workers waiting for a CPU that other processes
    held: one worker's such wait per second (`snap_ts` ordered, each snapshot covering the interval before it; see
    `InputBound`), over the step's span. A starved loader's n workers each make a batch in n steps, so each lost
    second of a worker costs the loop 1/n of a second, this much a step; a worker asleep in a read accrues none,
    so a slow read stays a data wait."""
    if not len(snap_ts) or not len(start):
        return np.zeros(len(start), np.int64)
    at = np.clip(np.searchsorted(snap_ts, start + dur // 2, "left"), 0, len(snap_ts) - 1)
    rate = np.maximum(np.nan_to_num(delay_ms_per_s, nan=0.0), 0.0) / 1000.0
    return (rate[at] * np.maximum(dur, 0)).astype(np.int64)


def less_workers_delay(dur: np.ndarray, wait: np.ndarray, floor: np.ndarray,
                       delay: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The steps' own times, their waits for data, and the least of each wait that was the loader's, less the time
    the workers were kept from a CPU by other processes (`workers_delay`): the step would have been that much
    shorter, its wait too; a busy machine's share of a wait is CPUContention's."""
    cut = np.minimum(np.maximum(delay, 0), wait)
    return dur - cut, wait - cut, np.maximum(floor - cut, 0)
