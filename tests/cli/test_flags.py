"""Flag values that would make a command do nothing useful are refused by the parser with the form to use."""

from __future__ import annotations

import argparse

import pytest

from stallwatch.cli import flags


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-5", "five"])
def test_fail_if_slower_takes_only_a_finite_percentage(text: str) -> None:
    """`compare --fail-if-slower nan` exited 0 on a run 17 % slower: a CI gate that could not fail."""
    with pytest.raises(argparse.ArgumentTypeError):
        flags.percent(text)


def test_a_percentage_is_taken() -> None:
    assert flags.percent("5") == 5.0 and flags.percent("0") == 0.0 and flags.percent("2.5") == 2.5


def test_the_compare_command_refuses_nan_before_reading_a_run(run_stallwatch, tmp_path) -> None:
    p = run_stallwatch("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--fail-if-slower", "nan")
    assert p.returncode == 2 and "not a percentage" in p.stderr and "Traceback" not in p.stderr
