"""`stallwatch ls ROOT`: the runs in a folder or bucket prefix, newest first."""

from __future__ import annotations

import argparse
import sys


def cmd_ls(args: argparse.Namespace) -> int:
    """The runs under a folder or bucket prefix (or the run itself), from their records alone."""
    from stallwatch.analyze.catalog import run_rows
    from stallwatch.present import console, json_out
    from stallwatch.store.catalog import list_runs

    try:
        rows = run_rows(list_runs(args.root))
    except (OSError, ValueError) as exc:
        print(f"stallwatch ls: cannot list {args.root} ({exc})", file=sys.stderr)
        return 2
    if args.json:
        print(json_out.dumps(json_out.runs_json(args.root, rows)))
    elif rows:
        print(console.runs_table(rows))
    else:
        print(f"stallwatch ls: no runs in {args.root}", file=sys.stderr)
    return 0
