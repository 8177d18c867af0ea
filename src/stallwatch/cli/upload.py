"""`stallwatch upload SRC DEST`: copy a run (e.g. what a dead S3 endpoint left in the local spool)."""

from __future__ import annotations

import argparse
import sys

from stallwatch.cli.opening import open_run_or_say


def cmd_upload(args: argparse.Namespace) -> int:
    from stallwatch.store.location import RunLocation
    from stallwatch.store.transfer import copy_run

    run = open_run_or_say("upload", args.source)
    if run is None:
        return 2
    from stallwatch.present.progress import Progress

    try:
        with Progress("upload", unit="B") as bar:
            result = copy_run(run.location, RunLocation(args.dest), delete_source=args.delete, progress=bar.update)
    except Exception as exc:
        print(f"stallwatch upload: could not copy to {args.dest}: {exc}. Nothing in {args.source} was removed; "
              "run the same command again once the destination is reachable.", file=sys.stderr)
        return 1
    print(f"copied {len(result.copied)} file(s) to {args.dest}, {len(result.skipped)} already there"
          + ("; removed the local copy" if args.delete else ""))
    return 0
