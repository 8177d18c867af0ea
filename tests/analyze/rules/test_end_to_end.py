"""The rules on real CPU training runs: a data loader in the main process with costly samples starves the loop
and makes Dataloader fire; planted slow steps make StepOutlier fire and name them; a healthy variant (workers
prepare the batches while each step computes) fires neither."""

from __future__ import annotations

import json
import sys

import pytest

from ...collect._support import stallwatch as run_cli

SCRIPT = '''
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
WORKERS, SLOW, COMPUTE_S = int(sys.argv[1]), {slow}, float(sys.argv[2])

def work(seconds):
    """CPU work, not a sleep: on a loaded machine the model's work stretches as the loading does, so the healthy
    run's wait for data stays a small share of its steps."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

class Costly(Dataset):
    def __len__(self): return 8 * 160
    def __getitem__(self, i):
        time.sleep({sample_s})  # decoding, augmenting…
        return torch.randn(16), torch.randn(1)

torch.manual_seed(0)
loader = DataLoader(Costly(), batch_size=8, num_workers=WORKERS, persistent_workers=WORKERS > 0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i, (x, y) in enumerate(loader):
    if i in SLOW:
        time.sleep(0.4)  # far above mean + 3σ, which the stalls themselves inflate (σ ≈ 0.26 × the stall)
    work(COMPUTE_S)  # the model's own work (a real model's forward and backward)
    opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
'''
SLOW_STEPS = (20, 35, 50, 65, 80, 95, 110, 120, 130, 140, 150, 155)  # 12 > n_outliers (10)


def _run(tmp_path, name: str, *, workers: int, slow: tuple[int, ...], sample_s: float,
         compute_s: float = 0.0) -> dict:
    script = tmp_path / f"{name}.py"
    script.write_text(SCRIPT.format(slow=set(slow) or "set()", sample_s=sample_s))
    run = tmp_path / name
    p = run_cli(tmp_path, "run", "--report", "off", "--interval", "100ms", "--out", str(run), "--",
                sys.executable, str(script), str(workers), str(compute_s), timeout=180)
    assert p.returncode == 0, p.stderr
    p = run_cli(tmp_path, "rules", str(run))
    assert p.returncode == 0, p.stderr
    out = {f.stem: json.loads(f.read_text()) for f in (run / "rules").glob("*.json")}
    out["_summary"] = p.stdout.decode()
    return out


@pytest.fixture(scope="module")
def troubled(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("troubled"), "troubled", workers=0, slow=SLOW_STEPS, sample_s=0.001)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("healthy"), "healthy", workers=2, slow=(), sample_s=0.0005,
                compute_s=0.01)


def test_main_process_loading_makes_dataloader_fire(troubled):
    r = troubled["Dataloader"]
    assert r["Status"] == "ok" and r["RuleTriggered"] >= 1
    assert "num_workers" in r["Recommendation"]
    assert r["Details"]["cores"] >= 1


def test_planted_slow_steps_make_step_outlier_fire_and_are_named(troubled):
    r = troubled["StepOutlier"]
    assert r["Status"] == "ok" and r["RuleTriggered"] >= 1
    named = json.dumps(r["Details"])
    for step in SLOW_STEPS:
        assert str(step) in named
    assert "StepOutlier" in troubled["_summary"] and "Dataloader" in troubled["_summary"]


def test_the_healthy_run_fires_neither(healthy):
    assert healthy["Dataloader"]["Status"] == "ok" and healthy["Dataloader"]["RuleTriggered"] == 0
    assert healthy["StepOutlier"]["Status"] == "ok" and healthy["StepOutlier"]["RuleTriggered"] == 0


def test_every_rule_wrote_its_file_and_gpu_rules_say_they_do_not_apply(healthy):
    from stallwatch.analyze.rules.registry import builtin_rules

    assert {c.name for c in builtin_rules()} <= set(healthy)
    for name in ("LowGPUUtilization", "GPUMemoryIncrease", "LoadBalancing"):
        if name in healthy:
            assert healthy[name]["Status"] == "not_applicable" and healthy[name]["Message"]
