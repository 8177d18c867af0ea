"""`stallwatch info RUN`: what a run holds."""

from __future__ import annotations

import argparse

from stallwatch.cli.opening import open_run_or_say


def cmd_info(args: argparse.Namespace) -> int:
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present.info import render_info

    run = open_run_or_say("info", args.run)
    if run is None:
        return 2
    if args.json:
        from stallwatch.present import json_out

        print(json_out.dumps(json_out.info_json(RunAnalysis(run))))
        return 0
    print(render_info(RunAnalysis(run)))
    return 0
