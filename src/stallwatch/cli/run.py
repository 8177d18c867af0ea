"""`stallwatch run -- CMD`: the job under the profiler (config checked first, the live rules and the dashboard
beside it), then `end_of_run.finish` with its exit code."""

from __future__ import annotations

import argparse
import sys

from stallwatch.cli.config_args import config_from_args
from stallwatch.cli.dashboard import start_dashboard, stop_dashboard
from stallwatch.cli.end_of_run import finish
from stallwatch.collect import report_timing
from stallwatch.config import ConfigError
from stallwatch.log import logger


def cmd_run(args: argparse.Namespace) -> int:
    from stallwatch.collect.launcher import RunConflictError, launch

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("stallwatch run: give the command to profile after --, e.g. stallwatch run -- python train.py",
              file=sys.stderr)
        return 2
    try:
        config = config_from_args(args, strict_file=False)
    except ConfigError as exc:
        print(f"stallwatch run: {exc}", file=sys.stderr)
        return 2
    from stallwatch.analyze.judge.during_run import LiveRules
    from stallwatch.collect.launcher import resolve_run_uri

    config = config.replace(out=resolve_run_uri(config))  # known now: the rules follow the run while it goes on
    live = LiveRules(config)
    timing = report_timing.choose(getattr(args, "report", report_timing.AUTO), interactive=at_a_terminal())
    logger.debug("the report after the job: %s (%s)", timing.mode, timing.why)
    if timing.mode == report_timing.WAIT:
        from stallwatch.present.report.warm import warm_in_background

        warm_in_background()
    dashboard = start_dashboard(config.out, args.dashboard) if getattr(args, "dashboard", None) is not None else None
    try:
        result = launch(command, config, on_job_started=live.start)
    except RunConflictError as exc:
        live.cancel()
        stop_dashboard(dashboard)
        print(f"stallwatch run: {exc}", file=sys.stderr)
        return 2
    except BaseException:
        stop_dashboard(dashboard)
        raise
    finish(result, config, live, report=timing.mode, as_json=getattr(args, "json", False))
    stop_dashboard(dashboard)
    return result.exit_code


def at_a_terminal() -> bool:
    """Whether a person is watching: stallwatch's own output (stderr) goes to a terminal."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (ValueError, OSError):  # closed or odd
        return False
