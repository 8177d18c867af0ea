"""`stallwatch report RUN`: the run's HTML report."""

from __future__ import annotations

import argparse
import sys

from stallwatch.cli.install_hint import install_command
from stallwatch.cli.opening import open_engine_or_say, open_run_or_say, open_with_rules


def cmd_report(args: argparse.Namespace) -> int:
    """Write the run's HTML report (report.html in the run, or -o FILE) and print where it went."""
    opened = open_with_rules("report", args)
    if opened is None:
        return 2
    run, custom, params = opened
    try:
        from stallwatch.analyze.analysis import RunAnalysis
        from stallwatch.present.progress import Progress
        from stallwatch.present.report import build_report

        baseline = None
        if args.baseline:
            base_run = open_run_or_say("report", args.baseline)
            if base_run is None:
                return 2
            baseline = RunAnalysis(base_run, rules=custom, params=params)
        engine = open_engine_or_say("report", args.engine)
        if engine is None:
            return 2
        try:
            with Progress("report", unit="sections") as bar:
                where = build_report(RunAnalysis(run, rules=custom, params=params, price_per_hour=args.price_per_hour,
                                                 baseline=baseline, engine=engine), args.output, progress=bar.update)
        finally:
            engine.close()
    except ImportError as exc:
        print(f"stallwatch report: {_package(exc)} is not installed: {install_command('dashboard')}",
              file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"stallwatch report: the report could not be written ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    print(where)
    return 0


def _package(exc: ImportError) -> str:
    """The package to install: `bokeh`, not the submodule whose import failed first (`bokeh.models`)."""
    return (exc.name or str(exc)).split(".")[0]
