"""`stallwatch dashboard ROOT`, and the dashboard `stallwatch run --dashboard` starts beside the job."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from stallwatch.cli.install_hint import install_command


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the dashboard until Ctrl-C; every reason it cannot start is one line and exit 2."""
    missing = _missing()
    if missing is not None:
        print(f"stallwatch dashboard: {missing}", file=sys.stderr)
        return 2
    from stallwatch.present.dashboard.server import DashboardError, listen, open_served, serve

    if args.parent is not None:
        _die_with(args.parent)
        _yield_to_job()
    try:
        token = _token(args)
        served = open_served(args.root, wait_s=max(args.wait, 0.0))
        listening, policy = listen(args.host, args.port, token)
    except DashboardError as exc:
        print(f"stallwatch dashboard: {exc}", file=sys.stderr)
        return 2
    from stallwatch.present.dashboard.security import is_loopback

    if not is_loopback(args.host):
        print(f"stallwatch dashboard: listening on {args.host}, beyond this machine: every request needs the "
              f"token in the URL below (give your own with {TOKEN_ENV} or --token-file)", file=sys.stderr)
    try:
        serve(served, listening, policy, open_browser=args.open)
    except KeyboardInterrupt:
        pass
    return 0


TOKEN_ENV = "STALLWATCH_DASHBOARD_TOKEN"


def _token(args: argparse.Namespace) -> str | None:
    """The token to require: --token-file, $STALLWATCH_DASHBOARD_TOKEN, or --token (said to be visible to every
    local user in the process list); None: one is generated and printed in the URL."""
    from stallwatch.present.dashboard.server import DashboardError

    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as fh:
                return fh.read(4096).strip() or ""
        except (OSError, UnicodeDecodeError) as exc:
            raise DashboardError(f"cannot read --token-file {args.token_file}: {getattr(exc, 'strerror', None) or exc}") \
                from None
    if os.environ.get(TOKEN_ENV) is not None:
        return os.environ[TOKEN_ENV]
    if args.token is not None:
        print(f"stallwatch dashboard: --token is readable by every local user (/proc/PID/cmdline); prefer "
              f"{TOKEN_ENV} or --token-file", file=sys.stderr)
    return args.token


NICE = 10  # the dashboard beside a job runs at this niceness: on a busy node the job's steps come first


def _yield_to_job() -> None:
    """Lower this process's priority before any thread starts (Linux gives each thread its own niceness, and
    new threads inherit it): a dashboard with many clients then takes only CPU the job leaves."""
    try:
        os.nice(NICE)
    except (OSError, AttributeError):
        pass


def _die_with(parent: int) -> None:
    """A dashboard started by `run --dashboard` ends with its launcher, even one killed by SIGKILL (it kept serving
    its port): the kernel sends SIGTERM when the parent dies (Linux), and a parent already gone ends it now."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        raise SystemExit(0)


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
                                 "--wait", "60", "--parent", str(os.getpid())], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
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
