"""`stallwatch completion SHELL`: the shell completion script."""

from __future__ import annotations

import argparse


def cmd_completion(args: argparse.Namespace) -> int:
    """The completion script for the shell, generated from this parser by argcomplete: `eval "$(stallwatch
    completion bash)"` in ~/.bashrc (zsh the same; fish: `stallwatch completion fish | source`)."""
    import argcomplete

    print(argcomplete.shellcode(["stallwatch"], shell=args.shell))
    return 0
