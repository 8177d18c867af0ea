"""`stallwatch run --report auto`: background only for a person at a terminal, where nothing ends a detached
process with the job; wait for scripts, schedulers and containers started for the job."""

from __future__ import annotations

import pytest

from stallwatch.collect.report_timing import AUTO, BACKGROUND, WAIT, choose

# a shell opened into a container from outside (docker exec): its parent is 0 in the container's PID namespace
EXEC_SHELL = {4242: 77, 77: 0}
# `docker run -it image bash`: the shell is the container's first process
FIRST_SHELL = {4242: 1}


def auto(*, interactive=True, environ=None, pid=4242, files=(), parents=None):
    return choose(AUTO, interactive=interactive, environ=environ or {}, pid=pid, exists=lambda p: p in files,
                  parent=(parents or EXEC_SHELL).get)


def test_a_person_at_a_terminal_gets_the_prompt_back_at_once():
    assert auto().mode == BACKGROUND


def test_without_a_terminal_the_report_is_there_when_the_command_returns():
    timing = auto(interactive=False)
    assert timing.mode == WAIT and "terminal" in timing.why


@pytest.mark.parametrize("variable", ["SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "KUBERNETES_SERVICE_HOST",
                                      "TRAINING_JOB_NAME", "SM_TRAINING_ENV"])
def test_a_scheduler_or_pod_that_ends_what_the_job_leaves_behind_waits(variable):
    timing = auto(environ={variable: "7"})
    assert timing.mode == WAIT and variable in timing.why


def test_an_empty_variable_is_not_a_scheduler():
    assert auto(environ={"SLURM_JOB_ID": ""}).mode == BACKGROUND


@pytest.mark.parametrize("mark", [{"files": ("/.dockerenv",)}, {"files": ("/run/.containerenv",)},
                                  {"environ": {"container": "podman"}}])
def test_a_container_whose_first_process_started_stallwatch_waits(mark):
    timing = auto(parents=FIRST_SHELL, **mark)
    assert timing.mode == WAIT and "container" in timing.why


def test_a_shell_opened_into_a_running_container_gets_the_prompt_back():
    assert auto(files=("/.dockerenv",), parents=EXEC_SHELL).mode == BACKGROUND


def test_stallwatch_as_the_first_process_waits_even_without_a_container_mark():
    assert auto(pid=1).mode == WAIT


def test_an_ancestor_that_cannot_be_read_ends_the_walk():
    assert auto(files=("/.dockerenv",), parents={4242: 99}).mode == BACKGROUND  # 99 gone: not the first process


def test_a_loop_in_the_ancestry_is_the_safe_answer():
    assert auto(files=("/.dockerenv",), parents={4242: 5, 5: 4242}).mode == WAIT


@pytest.mark.parametrize("mode", [WAIT, BACKGROUND, "off"])
def test_an_explicit_mode_is_kept(mode):
    assert choose(mode, interactive=True, environ={"SLURM_JOB_ID": "1"}).mode == mode
