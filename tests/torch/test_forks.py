"""A forked child (a fork-started DataLoader worker, a multiprocessing.Pool worker, a bare os.fork) inherits
the job's queued events: it must never send them again (duplicate steps) nor appear as a rank."""

from __future__ import annotations

import sys

import pytest

from stallwatch.records import STEP, TRAIN
from stallwatch.store.reader import open_run

from ..collect._support import stallwatch as run_cli

JOB = '''
import os, sys, multiprocessing as mp
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
kind = sys.argv[1]
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 2)), batch_size=8,
                  num_workers=2 if kind == "loader" else 0,
                  multiprocessing_context="fork" if kind == "loader" else None)

def square(v):
    return v * v

for epoch in range(2):
    for x, y in data:
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
    if kind == "pool":  # its workers exit without atexit
        with mp.get_context("fork").Pool(2) as pool:
            assert pool.map(square, range(4)) == [0, 1, 4, 9]
    if kind == "fork":  # a child that exits normally, running the inherited atexit handlers
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
'''


@pytest.mark.parametrize("kind", ["loader", "pool", "fork"])
def test_forked_children_never_resend_the_parents_events(tmp_path, kind):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / "run"
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(out), "--", sys.executable, str(script), kind)
    assert p.returncode == 0, p.stderr
    steps = open_run(str(out)).framework(kinds=[STEP]).to_pylist()
    train = [r for r in steps if r["mode"] == TRAIN]
    assert sorted(r["step"] for r in train) == list(range(16)), [r["step"] for r in train]  # was 40 (pool), 32 (fork)
    assert {r["rank"] for r in steps} == {0} and len({r["pid"] for r in train}) == 1
