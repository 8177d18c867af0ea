"""The dashboard's token never on a command line another user can read (an environment variable or a file, or
`--token` said to be visible), and a dashboard started for `run --dashboard` ends with its launcher even when
that launcher is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.present.generated_run import training_run


def _first_url(proc: subprocess.Popen) -> tuple[str, list[str]]:
    """The URL the dashboard prints, and the lines before it."""
    before: list[str] = []
    while True:
        line = proc.stderr.readline()
        assert line, "".join(before)
        if line.startswith("stallwatch dashboard: http://"):
            return line.split(": ", 1)[1].strip(), before
        before.append(line)


def _serve(run: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stallwatch", "dashboard", str(run), "--port", "0", *flags],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, **(env or {})})


def test_the_token_comes_from_a_file_or_the_environment_and_a_flag_is_said_to_be_visible(tmp_path: Path) -> None:
    run = training_run(tmp_path / "run", n=20)
    secret = tmp_path / "token"
    secret.write_text("from-a-file-0123456789\n")
    cases = [(("--token-file", str(secret)), {}, "from-a-file-0123456789", False),
             ((), {"STALLWATCH_DASHBOARD_TOKEN": "from-the-env-0123456789"}, "from-the-env-0123456789", False),
             (("--token", "on-the-command-line"), {}, "on-the-command-line", True)]
    for flags, env, token, warned in cases:
        proc = _serve(run, *flags, env=env)
        try:
            url, before = _first_url(proc)
            assert url.endswith(f"?token={token}")
            assert any("/proc/PID/cmdline" in line for line in before) == warned, before
        finally:
            proc.terminate()
            proc.wait(20)


def test_a_dashboard_started_for_a_run_ends_with_its_launcher_killed_by_sigkill(tmp_path: Path) -> None:
    run = training_run(tmp_path / "run", n=20)
    pid_file = tmp_path / "dashboard.pid"
    launcher = subprocess.Popen([sys.executable, "-c", f"""
import os, subprocess, sys, time
p = subprocess.Popen([sys.executable, "-m", "stallwatch", "dashboard", {str(run)!r}, "--port", "0",
                      "--parent", str(os.getpid())], stderr=subprocess.DEVNULL, start_new_session=True)
open({str(pid_file)!r}, "w").write(str(p.pid))
time.sleep(600)
"""])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        dashboard = int(pid_file.read_text())
        time.sleep(2)  # serving
        os.kill(dashboard, 0)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        deadline = time.monotonic() + 20
        while _alive(dashboard):
            assert time.monotonic() < deadline, "the dashboard outlived its launcher"
            time.sleep(0.1)
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:  # a zombie whose new parent has not reaped it yet is gone too
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
