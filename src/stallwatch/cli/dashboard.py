"""`stallwatch dashboard ROOT`, and the dashboard `stallwatch run --dashboard` starts beside the job."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stallwatch.cli.install_hint import install_command


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the dashboard until Ctrl-C; every reason it cannot start is one line and exit 2."""
    missing = _missing()
    if missing is not None:
        print(f"stallwatch dashboard: {missing}", file=sys.stderr)
        return 2
    from stallwatch.present.dashboard.security import is_loopback
    from stallwatch.present.dashboard.server import DashboardError, listen, open_served, serve

    try:
        served = open_served(args.root, wait_s=max(args.wait, 0.0))
        listening, policy = listen(args.host, args.port, args.token)
    except DashboardError as exc:
        print(f"stallwatch dashboard: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and args.token is None:
        print(f"stallwatch dashboard: listening on {args.host}, beyond this machine: every request needs the "
              "token in the URL below (give your own with --token)", file=sys.stderr)
    try:
        serve(served, listening, policy, open_browser=args.open)
    except KeyboardInterrupt:
        pass
    return 0


def start_dashboard(uri: str, port: int) -> Any:
    """`stallwatch run --dashboard`: the dashboard in a process of its own (its own session: the terminal's
    Ctrl-C goes to the job, not to it), so nothing it does can reach the job; it prints its URL itself. A
    dashboard that cannot start says why in one line and the job runs anyway."""
    import subprocess

    missing = _missing()
    if missing is not None:
        print(f"stallwatch run: no dashboard: {missing}; the job runs without it", file=sys.stderr)
        return None
    try:
        return subprocess.Popen([sys.executable, "-m", "stallwatch", "dashboard", uri, "--port", str(port),
                                 "--wait", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    except OSError as exc:
        print(f"stallwatch run: the dashboard could not start ({exc}); the job runs without it", file=sys.stderr)
        return None


def stop_dashboard(proc: Any) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except Exception:
        proc.kill()
        proc.wait()


def _missing() -> str | None:
    """Why the dashboard cannot be served here (a package of the `dashboard` extra missing), with the command
    that installs it; None when it can."""
    try:
        from stallwatch.present.dashboard.server import missing_package

        name = missing_package()
    except ImportError as exc:
        name = exc.name or str(exc)
    if name is None:
        return None
    return f"{name} is not installed (the dashboard needs the 'dashboard' extra): {install_command('dashboard')}"
