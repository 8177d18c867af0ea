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
_CACHE = "_runq_us"


def runq_column(cols: FrameworkColumns) -> np.ndarray:
    """Per row of a FrameworkColumns (analyze/framework_frame.py), the step's run-queue delay in µs (0 where the row
    is not a step or its args do not say); decoded once per table and shared by the rules that ask."""
    cached = cols.__dict__.get(_CACHE)
    if cached is not None:
        return cached
    out = np.zeros(cols.n, np.int64)
    rows = np.flatnonzero(cols.kind_is(STEP))
    if rows.size and "args" in cols.table.column_names:
        args = cols.table["args"].take(pa.array(rows))
        found = pc.struct_field(pc.extract_regex(args, RUNQ_PATTERN), [0])
        values = pc.fill_null(pc.cast(found, pa.int64()), 0).to_numpy(zero_copy_only=False)
        out[rows] = values
    cols.__dict__[_CACHE] = out
    return out


def step_runq(cols: FrameworkColumns, rows: np.ndarray) -> np.ndarray:
    """The run-queue delay (µs) of the step rows `rows`, at most each step's duration."""
    runq = runq_column(cols)[rows]
    return np.minimum(runq, np.maximum(cols.end[rows] - cols.start[rows], 0))


def own_time(dur: np.ndarray, runq: np.ndarray) -> np.ndarray:
    """Each step's own time: its duration less the time its training thread waited for a CPU."""
    return np.maximum(dur - np.minimum(runq, dur), 0)


def own_waits(dur: np.ndarray, wait: np.ndarray, runq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps' own time, their wait for data as a share of it, and the least of their wait that was the loader's.
    Where in a step its run-queue delay fell is not recorded: for shares it is spread over the step (the share
    waiting is the measured one), and a stall must be long even if every bit of the delay fell in its wait
    (a 0.1 ms fetch preempted for 10 ms is not a slow read)."""
    runq = np.minimum(runq, dur)
    own = dur - runq
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = np.where(dur > 0, wait - (runq * wait) // np.maximum(dur, 1), wait)
    return own, np.minimum(np.maximum(spread, 0), own), np.maximum(wait - runq, 0)
