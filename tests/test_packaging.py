"""A package users can trust: one version everywhere, a wheel and an sdist that `twine check` accepts and that
install into a fresh environment and run the demo, and a public API whose types mypy checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import stallwatch

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_one_version_everywhere():
    from importlib import metadata

    assert metadata.version("stallwatch") == stallwatch.__version__
    assert _run(sys.executable, "-m", "stallwatch", "--version").stdout.strip() == f"stallwatch {stallwatch.__version__}"
    assert f"## [{stallwatch.__version__}]" in (ROOT / "CHANGELOG.md").read_text()


def test_public_api_types_check():
    p = _run(sys.executable, "-m", "mypy", timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and wheel, built from a copy of the tree (the build leaves nothing in the checkout)."""
    tree = tmp_path_factory.mktemp("tree") / "stallwatch"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", "tests", "test-artifacts", "*.egg-info",
                                                              "build", "dist", "__pycache__", "stallwatch-runs"))
    out = tmp_path_factory.mktemp("dist")
    p = _run(sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out), cwd=tree)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


def test_wheel_and_sdist_pass_twine_check_and_hold_what_runs(dist: Path):
    wheel, = dist.glob("*.whl")
    sdist, = dist.glob("*.tar.gz")
    assert wheel.name.startswith(f"stallwatch-{stallwatch.__version__}-")
    p = _run(sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist))
    assert p.returncode == 0, p.stdout + p.stderr
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("stallwatch/py.typed", "stallwatch/_autoload/sitecustomize.py", "stallwatch/__main__.py"):
        assert needed in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Project-URL: Changelog" in meta and "Classifier: Typing :: Typed" in meta
    with tarfile.open(sdist) as tar:
        assert any(n.endswith("/CHANGELOG.md") for n in tar.getnames())


def _see_the_outer_environment(py: Path) -> None:
    """Inside a virtual environment, --system-site-packages shows the base interpreter's packages, not this
    environment's (pyarrow, torch… live here): a .pth names this environment's site folders. Their own .pth files
    are not read, so an editable checkout installed here stays out and the venv imports the wheel."""
    if sys.prefix == sys.base_prefix:
        return
    import site

    inner = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    (Path(inner) / "_outer_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")


def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_demo(dist: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    # the machine's packages stay visible (torch, numpy… are not downloaded again); stallwatch is the wheel's
    assert _run(sys.executable, "-m", "venv", "--system-site-packages", str(venv)).returncode == 0
    py = venv / "bin" / "python"
    _see_the_outer_environment(py)
    wheel, = dist.glob("*.whl")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # into the venv whatever the machine has (an editable checkout on PYTHONPATH is "already satisfied" otherwise)
    p = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    where = subprocess.run([str(py), "-c", "import stallwatch; print(stallwatch.__file__)"], capture_output=True,
                           text=True, env=env, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed wheel, not the source tree
    run = tmp_path / "demo"
    p = subprocess.run([str(venv / "bin" / "stallwatch"), "run", "--out", str(run), "--", str(py),
                        str(ROOT / "examples" / "train.py")], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (run / "report.html").exists() and json.loads((run / "findings.json").read_text())["verdict"]
    assert json.loads((run / "run.json").read_text())["versions"]["stallwatch"] == stallwatch.__version__
