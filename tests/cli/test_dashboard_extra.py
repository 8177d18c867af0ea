"""Without the `dashboard` extra (only `.[torch]` installed), `stallwatch dashboard` and `run --dashboard` say so in
one line naming the install command, and `run --dashboard` still runs the job. A package that refuses to import
stands in for the missing uvicorn (the test machine has the extra installed)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from pathlib import Path

import stallwatch.cli.install_hint as install_hint


def _without_uvicorn(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "site" / "uvicorn"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'uvicorn'\", name='uvicorn')\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))}


def test_the_dashboard_without_its_extra_is_one_line(tmp_path: Path, run_stallwatch):
    p = run_stallwatch("dashboard", str(tmp_path), "--port", "0", env=_without_uvicorn(tmp_path), timeout=60)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("stallwatch dashboard: uvicorn is not installed") and "pip install" in lines[0]
    assert "[dashboard]" in lines[0]


def test_run_with_a_dashboard_it_cannot_serve_still_runs_the_job(tmp_path: Path, run_stallwatch):
    run = tmp_path / "run"
    p = run_stallwatch("run", "--dashboard", "0", "--report", "off", "--out", str(run), "--", sys.executable, "-c",
                       "import sys; print('trained'); sys.exit(3)", env=_without_uvicorn(tmp_path), timeout=120)
    assert p.returncode == 3, p.stderr  # the job's own exit code
    assert p.stdout == "trained\n"
    assert "Traceback" not in p.stderr
    said = [line for line in p.stderr.splitlines() if "uvicorn" in line]
    assert len(said) == 1 and said[0].startswith("stallwatch run: no dashboard: uvicorn is not installed"), p.stderr
    assert "the job runs without it" in said[0] and "pip install" in said[0]
    assert (run / "run.json").exists()


def test_the_install_command_fits_a_checkout_and_a_package(tmp_path: Path):
    """A checkout (pyproject.toml and constraints.txt beside src/) installs itself with its constraints file;
    an installed package by its name."""
    checkout = Path(install_hint.__file__).resolve().parents[3]
    assert (checkout / "constraints.txt").is_file()
    here = install_hint.install_command("dashboard")
    assert here == f"python -m pip install -c {shlex.quote(str(checkout / 'constraints.txt'))} " \
                   f"-e {shlex.quote(f'{checkout}[dashboard]')}"

    package = tmp_path / "site-packages" / "stallwatch" / "cli"
    package.mkdir(parents=True)
    shutil.copy(install_hint.__file__, package / "install_hint.py")
    spec = importlib.util.spec_from_file_location("installed_hint", package / "install_hint.py")
    assert spec and spec.loader
    installed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installed)
    assert installed.install_command("dashboard") == "python -m pip install 'stallwatch[dashboard]'"
