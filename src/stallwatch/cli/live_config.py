"""`stallwatch config RUN`: show a run's profiling config, or change its live fields while the job runs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stallwatch.cli.opening import one_line, open_run_or_say
from stallwatch.config import LIVE_FIELDS, ConfigError, ProfilerConfig, ProfilingRange


def cmd_config(args: argparse.Namespace) -> int:
    """Show a run's config, or change its live fields: validated first, written atomically, or refused."""
    from stallwatch.store import run_files

    run = open_run_or_say("config", args.run)
    if run is None:
        return 2
    try:
        current = run_files.read_config(run.location)
    except FileNotFoundError:
        current = ProfilerConfig()
    except (ConfigError, OSError) as exc:
        print(f"stallwatch config: the run's config.json is invalid ({one_line(exc)}); fix or replace it",
              file=sys.stderr)
        return 2
    changes = {k: getattr(args, k) for k in LIVE_FIELDS if getattr(args, k, None) is not None}
    if getattr(args, "ask_stacks", False):  # a request counter: each raise asks once
        changes["dump_stacks"] = current.dump_stacks + 1
    clears = {name: None for name in (args.clear or [])}
    if not changes and not clears:
        print(current.to_json())
        return 0
    try:
        updated = current.replace(**changes, **clears)
    except ConfigError as exc:
        print(f"stallwatch config: {exc}. Nothing was changed.", file=sys.stderr)
        return 2
    run_files.write_config(run.location, updated)
    for name in sorted({**changes, **clears}):
        print(f"{name}: {_show(getattr(current, name))} -> {_show(getattr(updated, name))}")
    return 0


def _show(value: Any) -> str:
    return value.to_spec() if isinstance(value, ProfilingRange) else json.dumps(value)
