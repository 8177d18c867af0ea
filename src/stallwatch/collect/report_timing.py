"""When `stallwatch run` builds the report. A person at a terminal gets the prompt back with the job's status at
once, and the report a moment later from a detached process (a page that reloads itself stands in until then).
Scripts, batch schedulers and containers started for the job get the report before the command returns: a
script reads it next, and a detached process dies with the allocation or container. Imported before the job."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from stallwatch.collect import procfs

WAIT, BACKGROUND, OFF, AUTO = "wait", "background", "off", "auto"
MODES = (AUTO, WAIT, BACKGROUND, OFF)
# Where a process left behind is ended with the job: the variable that says so, and what it means.
ENDED_WITH_THE_JOB = (
    ("SLURM_JOB_ID", "a Slurm job"), ("PBS_JOBID", "a PBS job"), ("LSB_JOBID", "an LSF job"),
    ("KUBERNETES_SERVICE_HOST", "a Kubernetes pod"), ("TRAINING_JOB_NAME", "a SageMaker training job"),
    ("SM_TRAINING_ENV", "a SageMaker training job"),
)
# Docker's and Podman's marks inside a container (systemd-nspawn, Podman and LXC also set `container=…`)
CONTAINER_FILES = ("/.dockerenv", "/run/.containerenv")
MAX_ANCESTORS = 64


@dataclass(frozen=True)
class ReportTiming:
    """What `stallwatch run` does with the report after the job, and why (logged at debug level)."""
    mode: str
    why: str


def choose(requested: str, *, interactive: bool, environ: Mapping[str, str] | None = None, pid: int | None = None,
           exists: Callable[[str], bool] = os.path.exists,
           parent: Callable[[int], int | None] | None = None) -> ReportTiming:
    """`auto` is `background` only for a person at a terminal (stallwatch's own output, stderr, is one) outside
    anything that ends a detached process with the job; `wait` everywhere else. Other modes are as asked.
    In a container, a shell opened into it (`docker exec`) outlives the command; the container's own first
    process (`docker run -it … bash`, an entrypoint script) ends it, and everything in it, when it exits."""
    if requested != AUTO:
        return ReportTiming(requested, "as asked (--report)")
    if not interactive:
        return ReportTiming(WAIT, "not at a terminal: what runs next may read report.html")
    environ = os.environ if environ is None else environ
    pid = os.getpid() if pid is None else pid
    for variable, what in ENDED_WITH_THE_JOB:
        if environ.get(variable):
            return ReportTiming(WAIT, f"in {what} ({variable} is set): a detached process ends with the job")
    if pid == 1:
        return ReportTiming(WAIT, "stallwatch is the first process of its PID namespace (a container's): everything "
                                  "left behind ends when it exits")
    marks = [path for path in CONTAINER_FILES if exists(path)]
    marks += [f"container={environ['container']}"] if environ.get("container") else []
    if marks and _descends_from_first_process(pid, parent or procfs.parent):
        return ReportTiming(WAIT, f"in a container ({marks[0]}) that ends when its first process, one that "
                                  "started stallwatch, exits")
    return ReportTiming(BACKGROUND, "at a terminal: the prompt comes back at once, the report a moment later")


def _descends_from_first_process(pid: int, parent: Callable[[int], int | None]) -> bool:
    """Whether pid is 1 or one of its ancestors is (within this PID namespace: a process started from outside
    it, as `docker exec` does, has parent 0)."""
    for _ in range(MAX_ANCESTORS):
        if pid == 1:
            return True
        if pid <= 0 or (up := parent(pid)) is None:
            return False
        pid = up
    return True  # a chain this long is not what we think it is: the safe answer
