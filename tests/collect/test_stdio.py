"""`stallwatch run` started with stdin, stdout or stderr closed behaves as the bare command: the job finds the
same descriptors closed and prints the same, stallwatch's summary never lands in the job's stdout, and
the job's steps are recorded (the launcher crashed with stdin closed and the job never started)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stallwatch.records import STEP, TRAIN
from stallwatch.store.reader import open_run

from ._support import STALLWATCH

JOB = '''
import os, sys, torch
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for xb in torch.utils.data.DataLoader(torch.randn(32, 4), batch_size=4):
    opt.zero_grad(); m(xb).sum().backward(); opt.step()
state = []
for fd in (0, 1, 2):
    try:
        os.fstat(fd)
        state.append(f"{fd} open")
    except OSError:
        state.append(f"{fd} closed")
open(sys.argv[1], "w").write(", ".join(state))
print("job says hello")
print("job complains", file=sys.stderr)  # with stderr closed, Python prints this on stdout
'''


def _run(tmp_path, argv: list[str], closed: int, name: str) -> tuple[int, bytes, bytes, str]:
    def close_it() -> None:
        os.close(closed)

    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        code = subprocess.run([*argv, str(tmp_path / f"{name}.state")], stdin=subprocess.DEVNULL, stdout=o,
                              stderr=e, preexec_fn=close_it, timeout=120, cwd=tmp_path).returncode
    return code, out.read_bytes(), err.read_bytes(), (tmp_path / f"{name}.state").read_text()


@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_closed_standard_stream_behaves_as_without_stallwatch(tmp_path, closed):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = [sys.executable, str(script)]
    bare = _run(tmp_path, job, closed, "bare")
    run = tmp_path / "run"
    profiled = _run(tmp_path, [*STALLWATCH, "run", "--report", "off",
                               "--out", str(run), "--", *job], closed, "profiled")
    assert profiled[0] == bare[0] == 0, profiled[2].decode(errors="replace")
    assert profiled[3] == bare[3] and f"{closed} closed" in bare[3]  # the job's descriptors, as the user left them
    if closed != 1:
        assert profiled[1] == bare[1]  # the job's stdout, byte for byte: no summary in it
    if closed != 2:
        assert b"stallwatch: run" in profiled[2] and b"job complains" in profiled[2]
    steps = open_run(str(run)).framework(kinds=[STEP]).to_pylist()
    assert len([r for r in steps if r["mode"] == TRAIN]) == 8


def test_a_long_temporary_directory_keeps_framework_profiling_on(tmp_path):
    """A TMPDIR too long for a Unix socket's path (108 bytes) silently turned framework profiling off."""
    long_tmp = tmp_path / ("t" * 60) / ("u" * 60)
    long_tmp.mkdir(parents=True)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run = tmp_path / "run"
    p = subprocess.run([*STALLWATCH, "run", "--report", "off", "--out", str(run), "--", sys.executable, str(script),
                        str(tmp_path / "state")], env={**os.environ, "TMPDIR": str(long_tmp)},
                       capture_output=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    steps = open_run(str(run)).framework(kinds=[STEP]).to_pylist()
    assert len([r for r in steps if r["mode"] == TRAIN]) == 8
    assert not [d for d in os.listdir(long_tmp) if d.startswith("stallwatch-")]  # the private directories are gone
