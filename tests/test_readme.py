"""The README's two opening commands are the product's promise: keep them true and in step with CI."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _opening_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [b.strip() for b in re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)][:2]


def test_readme_opens_with_run_and_test_commands() -> None:
    run, test = _opening_commands()
    assert "constraints.txt" in run and "stallwatch run" in run and "examples/train.py" in run
    assert "constraints.txt" in test and "pytest" in test


def test_ci_runs_the_readme_test_command() -> None:
    _, test = _opening_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    assert test in ci.splitlines()


def test_constraints_pin_torch() -> None:
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().split()


def test_demo_script_exists() -> None:
    assert (ROOT / "examples" / "train.py").is_file()
