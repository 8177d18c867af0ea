"""The entry point: parse, set the output's verbosity, run the command; a store that stops answering is one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from stallwatch.cli.opening import one_line
from stallwatch.cli.parser import build_parser
from stallwatch.log import configure_cli_logging, logger


def main(argv: Sequence[str] | None = None) -> int:
    from stallwatch.collect.stdio import hold_closed_standard_fds

    hold_closed_standard_fds()  # before anything opens a file
    configure_cli_logging()
    parser = build_parser()
    _complete(parser)
    args = parser.parse_args(argv)
    if args.quiet:
        import logging

        from stallwatch.present import progress

        progress.QUIET = True
        logger.setLevel(logging.WARNING)
    from stallwatch.analyze.engine import EngineError

    try:
        return int(args.func(args))
    except EngineError as exc:  # a Dask cluster that lost its scheduler or its workers halfway: one line
        print(f"stallwatch {args.cmd}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a store that stopped answering halfway (S3 down, a disk gone): one line, no traceback
        print(f"stallwatch {args.cmd}: {one_line(exc)}", file=sys.stderr)
        return 2


def _complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request (argcomplete sets _ARGCOMPLETE), otherwise nothing."""
    import os

    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(parser)

