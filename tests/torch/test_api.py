"""The explicit API: `stallwatch.torch.profile()` records a run by itself (no `stallwatch run`), with
exact step marks in both styles; outside it nothing is hooked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stallwatch.records import DATA_WAIT, EVAL, STEP, TRAIN
from stallwatch.store.reader import open_run
from stallwatch.torch.api import mode_name

SCRIPT = '''
import sys, torch
import stallwatch.torch
from torch.utils.data import DataLoader
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
train = DataLoader(torch.randn(24, 8), batch_size=4)
evaluate = DataLoader(torch.randn(8, 8), batch_size=4)
with stallwatch.torch.profile(out=sys.argv[1], sample_interval_ms=100, flush_interval_s=1,
                              detailed_profiling="3:2") as prof:
    for epoch in range(2):
        for xb in train:
            with prof.step("train"):
                opt.zero_grad(); model(xb).sum().backward(); opt.step()
        for xb in evaluate:
            prof.step("eval")  # the marker style: this step ends at the next mark
            with torch.no_grad():
                model(xb)
    prof.step("global")
print("windows", [(w["layer"], w["first_step"], w["last_step"]) for w in prof.windows])
from stallwatch.torch import session
print("hooked after exit:", session.current() is not None)
'''


def test_profile_records_a_run_without_stallwatch_run(tmp_path):
    script = tmp_path / "explicit.py"
    script.write_text(SCRIPT)
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "windows [('detailed', 3, 4)]" in p.stdout and "hooked after exit: False" in p.stdout
    r = open_run(str(run))
    events = r.framework().to_pylist()
    steps = [(e["mode"], e["step"]) for e in events if e["kind"] == STEP]
    assert sorted(s for m, s in steps if m == TRAIN) == list(range(12))
    assert sorted(s for m, s in steps if m == EVAL) == list(range(4))
    # Both styles: each step owns the batch fetched just before its mark.
    assert sorted(e["step"] for e in events if e["kind"] == DATA_WAIT and e["mode"] == EVAL) == list(range(4))
    assert sorted(e["step"] for e in events if e["kind"] == DATA_WAIT and e["mode"] == TRAIN) == list(range(12))
    (node,) = r.info["nodes"].values()
    assert node["status"] == "finished" and node["exit_code"] == 0
    assert r.system().num_rows > 0  # the machine was sampled too
    (window,) = r.profiles("detailed")
    assert (window["first_step"], window["last_step"]) == (3, 4)


@pytest.mark.parametrize("given, expected", [("train", TRAIN), ("Validation", EVAL), ("EVAL", EVAL), (None, None)])
def test_mode_names(given, expected):
    assert mode_name(given) == expected


def test_an_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="'train', 'eval' or 'global'"):
        mode_name("training-ish")


def test_a_bad_config_field_fails_before_anything_starts():
    import stallwatch.torch
    from stallwatch.config import ConfigError

    with pytest.raises(ConfigError, match="sample_interval_ms"):
        stallwatch.torch.profile(out="/nonexistent/never-created", sample_interval_ms=5)
