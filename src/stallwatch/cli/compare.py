"""`stallwatch compare BASELINE RUN`: a run against a baseline, and the CI gate on slower steps."""

from __future__ import annotations

import argparse
import sys

from stallwatch.cli.opening import open_run_or_say


def cmd_compare(args: argparse.Namespace) -> int:
    """A run against a baseline, as text or JSON; exit 1 with --fail-if-slower when steps regressed."""
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present import json_out
    from stallwatch.present.compare import comparison_text

    base_run = open_run_or_say("compare", args.baseline)
    if base_run is None:
        return 2
    run = open_run_or_say("compare", args.run)
    if run is None:
        return 2
    baseline = RunAnalysis(base_run, price_per_hour=args.price_per_hour)
    analysis = RunAnalysis(run, price_per_hour=args.price_per_hour, baseline=baseline)
    comparison = analysis.comparison
    slower = comparison.slower_pct(args.mode, args.quantile)
    failed = args.fail_if_slower is not None and slower is not None and slower > args.fail_if_slower
    if args.json:
        doc = json_out.compare_json(analysis)
        doc["cost"] = {"baseline": baseline.cost.to_json() if baseline.cost else None,
                       "run": analysis.cost.to_json() if analysis.cost else None}
        doc["regression"] = {"mode": args.mode, "quantile": args.quantile, "slower_pct": slower,
                             "fail_if_slower": args.fail_if_slower, "failed": failed}
        print(json_out.dumps(doc))
    else:
        print(comparison_text(comparison, baseline.cost, analysis.cost))
    if args.fail_if_slower is not None:
        if slower is None:
            print(f"stallwatch compare: no {args.mode} steps in both runs: cannot tell whether it is slower",
                  file=sys.stderr)
            return 2
        if failed:
            print(f"stallwatch compare: {args.mode} step time p{round(args.quantile * 100)} is {slower:.1f} % slower "
                  f"than the baseline's (limit {args.fail_if_slower:g} %)", file=sys.stderr)
            return 1
    return 0
