"""`stallwatch summary RUN`: what `stallwatch run` prints at the end, for any run, and the CI gate on findings."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stallwatch.cli.opening import open_with_rules


def cmd_summary(args: argparse.Namespace) -> int:
    """A run's summary and findings, as `stallwatch run` prints them at the end (text or --json)."""
    opened = open_with_rules("summary", args)
    if opened is None:
        return 2
    run, custom, params = opened
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present import json_out
    from stallwatch.present.summary import summary_text

    analysis = RunAnalysis(run, rules=custom, params=params, price_per_hour=args.price_per_hour)
    if args.node and args.node not in analysis.nodes:
        print(f"stallwatch summary: no node {args.node!r} in {run.uri}; its nodes: {', '.join(analysis.nodes)}",
              file=sys.stderr)
        return 2
    if args.json:
        print(json_out.dumps(json_out.summary_json(analysis, args.node)))
    else:
        print(summary_text(analysis, args.node))
        print(_report_line(run), file=sys.stderr)  # as `stallwatch run` ends
    return 1 if fails(analysis.findings, args.fail_on) else 0


def _report_line(run: Any) -> str:
    """Where the run's report is, or the command that writes it."""
    from stallwatch.store import layout

    try:
        there = run.location.exists(layout.REPORT_HTML)
    except OSError:
        there = False
    if not there:
        return f"stallwatch: no report yet: `stallwatch report {run.uri}` writes it"
    where = run.location.local_path(layout.REPORT_HTML) if not run.location.remote else f"{run.uri}/{layout.REPORT_HTML}"
    return f"stallwatch: report {where}"


def fails(findings: Any, fail_on: str | None) -> bool:
    """A finding at `fail_on` or above (any: any finding at all)."""
    if fail_on is None:
        return False
    order = {"low": 0, "medium": 1, "high": 2}
    floor = -1 if fail_on == "any" else order[fail_on]
    return any(order.get(f.severity, 0) >= floor for f in findings.findings)
