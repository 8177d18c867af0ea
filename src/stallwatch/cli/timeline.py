"""`stallwatch timeline RUN`: the run as one Chrome-trace / Perfetto file."""

from __future__ import annotations

import argparse
import sys

from stallwatch.cli.opening import open_engine_or_say, open_run_or_say
from stallwatch.log import logger


def cmd_timeline(args: argparse.Namespace) -> int:
    """Write the run as one Chrome-trace / Perfetto file (nodes, ranks and counters on one time axis)."""
    from pathlib import Path

    from stallwatch.present.trace_export import export_timeline, resolve_time, run_origin_us
    from stallwatch.store import layout

    run = open_run_or_say("timeline", args.run)
    if run is None:
        return 2
    # The run id is data from the run: only a plain name goes into a path (never "../x" or "/etc/x").
    name = layout.plain_name(run.info.get("run_id")) or layout.plain_name(Path(args.run.rstrip("/")).name) or "run"
    out = args.output or f"{name}-timeline.json.gz"
    try:
        origin = run_origin_us(run)
        start = None if args.start is None else resolve_time(args.start, origin, "--start")
        end = None if args.end is None else resolve_time(args.end, origin, "--end")
        if start is not None and end is not None and start >= end:
            raise ValueError(f"--start {args.start} is not before --end {args.end}")
    except ValueError as exc:
        print(f"stallwatch timeline: {exc}", file=sys.stderr)
        return 2
    from stallwatch.present.progress import Progress

    engine = open_engine_or_say("timeline", args.engine)
    if engine is None:
        return 2
    try:
        with Progress("timeline", unit="nodes") as bar:
            s = export_timeline(run, out, start_us=start, end_us=end, max_points=args.max_points,
                                max_events=args.max_events, all_metrics=args.all_metrics, profiler=args.profiler,
                                progress=bar.update, engine=engine)
    except OSError as exc:
        print(f"stallwatch timeline: cannot write {out} ({exc})", file=sys.stderr)
        return 1
    finally:
        engine.close()
    logger.info("timeline: %d framework events, %d counter tracks (%d points), %d detailed profiling window(s)",
                s.framework_events, s.counter_series, s.counter_points, s.profiler_windows)
    print(s.path)
    return 0
