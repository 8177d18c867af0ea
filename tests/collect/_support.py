"""Non-fixture helpers of the collect tests: running the real CLI, reading a run back, the fake pynvml."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import psutil

FAKE_PYNVML_DIR = Path(__file__).parent / "fake_pynvml"
STALLWATCH = [sys.executable, "-m", "stallwatch.cli"]
SAMPLER_MODULE = "stallwatch.collect.sampler_process"

# What the monitored commands print: must come out of `stallwatch run` byte for byte.
PAYLOAD = (b"plain ascii line\n"
           + "unicode: h\u00e9llo \u2713 \u65e5\u672c\u8a9e \U0001f600\n".encode()
           + b"binary-ish: \x00\x01\x02\xff\xfe\x80 not utf-8\n"
           + b"windows line\r\n"
           + b"\tindented\x1b[31m ansi red\x1b[0m\n"
           + b"".join(b"%06d " % i + b"x" * 90 + b"\n" for i in range(2000))  # ~200 KB
           + b"no newline at the end")


def load_fake_pynvml(**settings) -> ModuleType:
    """A fresh copy of the fake pynvml (its own state), configured with `settings` (see its docstring)."""
    spec = importlib.util.spec_from_file_location("fake_pynvml_under_test", FAKE_PYNVML_DIR / "pynvml.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if settings:
        mod.configure(**settings)
    return mod


def pythonpath_with(*dirs: Path) -> str:
    parts = [str(d) for d in dirs]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


def job(tmp_path: Path, body: str, *, exit_code: int = 0) -> list[str]:
    """A Python command that prints PAYLOAD to stdout, runs `body`, then exits with `exit_code`."""
    payload = tmp_path / "payload.bin"
    if not payload.exists():
        payload.write_bytes(PAYLOAD)
    script = tmp_path / f"job-{abs(hash((body, exit_code))):x}.py"
    script.write_text(
        "import os, signal, sys, time\n"
        f"sys.stdout.buffer.write(open({str(payload)!r}, 'rb').read())\n"
        "sys.stdout.flush()\n"
        f"{body}\n"
        f"sys.exit({exit_code})\n")
    return [sys.executable, str(script)]


def stallwatch(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
               timeout: float = 90) -> subprocess.CompletedProcess:
    """`stallwatch ARGS` in tmp_path, stdout as bytes (to compare byte for byte), stderr as text."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.run([*STALLWATCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, env=full_env, cwd=tmp_path)
    p.stderr = p.stderr.decode(errors="replace")
    return p


class Background:
    """`stallwatch ARGS` started in the background, its output going to files (so a process it leaves
    behind cannot hold a pipe of the test open)."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None, name: str = "launcher") -> None:
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.out_path = tmp_path / f"{name}.stdout"
        self.err_path = tmp_path / f"{name}.stderr"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([*STALLWATCH, *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=full_env, cwd=tmp_path)

    def wait(self, timeout: float = 90) -> int:
        return self.proc.wait(timeout=timeout)

    @property
    def stdout(self) -> bytes:
        return self.out_path.read_bytes()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def kill_all(self) -> None:
        """Clean up whatever is left: the launcher, its children, and anything else of this test."""
        procs = []
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            pass
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def wait_until(pred, timeout: float, period: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(period)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def node_record(run: Path, node: str) -> dict:
    return json.loads((run / "nodes" / f"{node}.json").read_text())


def system_table(run: Path, node: str | None = None):
    import stallwatch

    return stallwatch.open_run(str(run)).system(nodes=None if node is None else [node])


def snapshot_times(run: Path, node: str | None = None) -> list[int]:
    """Distinct snapshot timestamps (µs) stored for a node, read back through the public reader."""
    table = system_table(run, node)
    return sorted(set(table.column("timestamp_us").to_pylist()))


def series(run: Path, node: str, device: str, metric: str) -> dict[int, float]:
    """timestamp -> value of one stored series (missing values are absent)."""
    t = system_table(run, node).to_pylist()
    return {row["timestamp_us"]: row["value"] for row in t if row["device"] == device and row["metric"] == metric}


def sampler_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info.get("cmdline") or []
        if SAMPLER_MODULE in cmd and p.info.get("status") != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


def now_us() -> int:
    return time.time_ns() // 1000

