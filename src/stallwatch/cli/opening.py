"""What the commands that read a run share: opening it, its engine and the rules the person named, each
failure said in one line (the caller then exits 2)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An error as one short line (pyarrow's S3 errors run over several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


def open_run_or_say(command: str, uri: str) -> Any:
    """The run at `uri`, or None after saying why it is not one."""
    from stallwatch.store.reader import RunNotFoundError, open_run

    try:
        run = open_run(uri)
    except RunNotFoundError as exc:
        print(f"stallwatch {command}: {exc}", file=sys.stderr)
        return None
    except (OSError, ValueError) as exc:  # an unreachable endpoint, a location that is not one
        print(f"stallwatch {command}: cannot open {uri}: {one_line(exc)}", file=sys.stderr)
        return None
    from stallwatch.collect.leftovers import clean_leftovers

    clean_leftovers(run.uri)  # private folders a killed `stallwatch run` of this run left on this machine
    return run


def open_engine_or_say(command: str, spec: str) -> Any:
    """The engine `--engine` names, started (a local Dask cluster) or reached (a scheduler); None after
    saying in one line why it cannot be."""
    from stallwatch.analyze.engine import EngineError, open_engine

    try:
        return open_engine(spec)
    except EngineError as exc:
        print(f"stallwatch {command}: {exc}", file=sys.stderr)
        return None


def open_with_rules(command: str, args: argparse.Namespace) -> tuple[Any, list, dict] | None:
    """The run, the custom rules named with --custom-rule and the rule parameters given with --param; None after
    saying what is wrong."""
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.rules.registry import builtin_rules, parse_params

    run = open_run_or_say(command, args.run)
    if run is None:
        return None
    try:
        custom = _custom_rules(command, args)
    except ValueError:
        return None
    try:
        params = parse_params(getattr(args, "param", None) or [],
                              builtin_rules() + [c for c in custom if c not in builtin_rules()])
    except ParameterError as exc:
        print(f"stallwatch {command}: {exc}", file=sys.stderr)
        return None
    return run, custom, params


def _custom_rules(command: str, args: argparse.Namespace) -> list:
    """The custom rules the person named with --custom-rule, loaded; a bad one is said, and raises ValueError."""
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.rules.registry import load_custom

    try:
        return load_custom(tuple(getattr(args, "custom_rules", None) or ()))
    except ParameterError as exc:
        print(f"stallwatch {command}: {exc}", file=sys.stderr)
        raise ValueError(str(exc)) from None
