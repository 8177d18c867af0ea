"""In an interactive terminal, stallwatch must behave like the bare command: Ctrl-C reaches the job,
Ctrl-Z gives the shell its prompt back, `fg` resumes the job (a real pty and a real bash)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pexpect
import pytest

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

JOB = "import time, itertools\nfor i in itertools.count(): print(f'tick {i}', flush=True); time.sleep(0.3)\n"


def _shell(tmp_path: Path) -> pexpect.spawn:
    (tmp_path / "job.py").write_text(JOB)
    sh = pexpect.spawn("bash", ["--norc", "--noprofile", "-i"], cwd=str(tmp_path), encoding="utf-8",
                       timeout=60, env={"PS1": "PROMPT> ", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                        "TERM": "dumb"})
    sh.expect_exact("PROMPT> ")
    return sh


def test_ctrl_z_stops_and_fg_resumes_then_ctrl_c_ends_the_job(tmp_path: Path) -> None:
    sh = _shell(tmp_path)
    sh.sendline(f"{sys.executable} -m stallwatch.cli run --interval 200ms -- {sys.executable} job.py")
    sh.expect(r"tick 2")
    sh.sendcontrol("z")
    sh.expect_exact("PROMPT> ")  # the shell got its prompt back: the launcher stopped with its job
    sh.sendline("jobs")
    sh.expect(r"Stopped")
    sh.expect_exact("PROMPT> ")
    sh.sendline("fg")
    sh.expect(r"tick \d+")  # the job runs again and owns the terminal
    sh.expect(r"tick \d+")
    sh.sendcontrol("c")
    sh.expect(r"KeyboardInterrupt")  # Ctrl-C reached the job itself
    sh.expect(r"command exit code 130")
    sh.expect_exact("PROMPT> ")
    sh.sendline("echo status=$?")
    sh.expect(r"status=130")
    sh.sendline("exit")
    sh.expect(pexpect.EOF)
