"""Imports the report's code (the sections, numpy, the store) and reads BokehJS while the job is still running, so that building the
report after the job costs only the building: about half of it was importing. `stallwatch run` waits for the
report before returning the job's exit status; this takes that import off the wait."""

from __future__ import annotations

import importlib
import os
import threading
import time

from stallwatch.log import logger

START_AFTER_S = 1.0  # the job's own start-up comes first: a job shorter than this imports after it, as before
MODULES = ("stallwatch.present.report", "stallwatch.present.drawpage")


def warm_in_background(*, start_after_s: float = START_AFTER_S) -> threading.Event:
    """Start a daemon thread, at the lowest CPU priority (the job's cores are the job's), that imports what the
    report needs; returns an event set once it is done (or gave up). Never raises: a failure here only
    means the import happens later, where a missing module is reported as it always was."""
    done = threading.Event()

    def run() -> None:
        tid = threading.get_native_id()
        try:  # this thread only (Linux): it runs when a core is otherwise idle, never in the job's way
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):
            try:
                os.setpriority(os.PRIO_PROCESS, tid, 19)
            except (OSError, AttributeError):
                pass
        try:
            time.sleep(start_after_s)
            for name in MODULES:
                importlib.import_module(name)
            from stallwatch.present.report.sections import section_modules

            section_modules()
            from stallwatch.present import drawpage

            drawpage.scripts_text()  # BokehJS read from disk once, while the job runs
        except Exception as exc:  # noqa: BLE001 — including ImportError: the report says it itself, later
            logger.debug("report warm-up stopped (%s: %s)", type(exc).__name__, exc)
        finally:
            done.set()

    try:
        threading.Thread(target=run, name="stallwatch-report-warm-up", daemon=True).start()
    except RuntimeError:
        done.set()
    return done
