"""`stallwatch dashboard` as a user runs it (a real process): it serves and prints its URL; each way it cannot
start (port taken, not a run, bucket unreachable) is one line and exit 2, no traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.present.dashboard.conftest import request


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallwatch", "dashboard", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                                                "AWS_REGION": "us-east-1"})


def _one_clear_line(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("stallwatch dashboard: "), result.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_port_taken(runs_root: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        _one_clear_line(_cli(str(runs_root), "--port", str(s.getsockname()[1])), "is taken", "--port")


def test_not_a_run_and_unreachable_bucket(tmp_path: Path) -> None:
    _one_clear_line(_cli(str(tmp_path / "missing")), "not a folder")
    with socket.socket() as s:  # a port nobody answers on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _one_clear_line(_cli(f"s3://bucket/prefix?endpoint_override=127.0.0.1:{port}&scheme=http"), "cannot")


def test_serves_and_stops_on_sigterm(runs_root: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "stallwatch", "dashboard", str(runs_root / "run-b"), "--port", "0",
                             "--host", "0.0.0.0"], stderr=subprocess.PIPE, text=True)
    try:
        warning = proc.stderr.readline()
        assert "token" in warning  # beyond loopback: said, and a token is required
        line = proc.stderr.readline()
        assert line.startswith("stallwatch dashboard: http://") and "?token=" in line
        url = line.split(": ", 1)[1].strip()
        base, _, token = url.partition("?token=")
        deadline = time.monotonic() + 20
        while True:
            try:
                status, _, body = request(base + "api/runs", headers={"authorization": f"Bearer {token}"})
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert status == 200 and b'"single":true' in body
        assert request(base + "api/runs")[0] == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled


def test_run_with_a_dashboard_that_cannot_start_still_runs_the_job(tmp_path: Path) -> None:
    """`stallwatch run --dashboard=PORT` on a taken port: the dashboard's process says so in one line; the job
    runs to its end and its exit code stands."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "stallwatch", "run", "--out", str(tmp_path / "r"), "--no-gpu", f"--dashboard={port}",
             "--", sys.executable, "-c", "import time; time.sleep(2); print('trained'); raise SystemExit(3)"],
            capture_output=True, text=True, timeout=120)
    assert result.returncode == 3 and "trained" in result.stdout
    assert f"stallwatch dashboard: port {port} on 127.0.0.1 is taken" in result.stderr
    assert "Traceback" not in result.stderr
