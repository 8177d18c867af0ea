"""The install command for an optional extra, as this installation takes it: a checkout's own (with its
constraints file, or pip may pull another torch, gigabytes of CUDA) or the package's."""

from __future__ import annotations

import shlex
from pathlib import Path


def install_command(extra: str) -> str:
    """`python -m pip install ...` that adds `extra` here (an editable checkout: its path; else the package)."""
    root = Path(__file__).resolve().parents[3]  # src/stallwatch/cli/ -> the checkout
    if (root / "pyproject.toml").is_file() and (root / "constraints.txt").is_file():
        return (f"python -m pip install -c {shlex.quote(str(root / 'constraints.txt'))} "
                f"-e {shlex.quote(f'{root}[{extra}]')}")
    return f"python -m pip install 'stallwatch[{extra}]'"
