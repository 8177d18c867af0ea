"""The `stallwatch` command line: the parser (`parser.py`, its flags in `flags.py`), `stallwatch run` (`run.py`,
then `end_of_run.py`), and one module per other command. It parses and wires the stages, nothing more."""

from stallwatch.cli.entry import main
from stallwatch.cli.parser import build_parser

__all__ = ["build_parser", "main"]
