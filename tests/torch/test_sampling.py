"""Sampled steps in real jobs under `stallwatch run`: at step rates above `sample_steps_above_per_s` the job
times steps in stretches and counts the others. Whatever the loop (epochs of a DataLoader with an evaluation
loop between them, explicit marks), every step is counted exactly once, with its number, and the timed steps
are whole steps with their phases."""

from __future__ import annotations

import json
import sys
import textwrap
from collections import Counter

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.records import EVAL, STEP, TRAIN, UNTIMED
from stallwatch.store.reader import open_run

from ..collect._support import stallwatch as run_cli
from .test_loop_shapes import _phase_sums_fit_their_steps

BUSY = '''def busy(us):
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass
'''

# Steps of ~0.3 ms for 1.5-3 s: a few one-second periods of sampling at 500 steps/s, epochs ending while paused.
LOADER_EPOCHS = '''
import json, sys, time
import torch
from torch.utils.data import DataLoader
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.ones(4)
train, evals = 0, 0
''' + BUSY + '''for epoch in range(4):
    for i in DataLoader(range(1200), batch_size=None):
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        busy(150)
        train += 1
    with torch.no_grad():
        for i in DataLoader(range(300), batch_size=None):
            model(x)
            busy(150)
            evals += 1
json.dump({"train": train, "eval": evals}, open(sys.argv[1], "w"))
'''

# One training step of ~0.3 ms: the body of the marked and the optimizer-delimited jobs' loops.
STEP_BODY = '''loss = model(x).sum()
opt.zero_grad()
loss.backward()
opt.step()
end = time.perf_counter() + 150e-6
while time.perf_counter() < end:
    pass
'''

MARKS = '''
import json, sys, time
import torch
import stallwatch.torch as swt
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.ones(4)
n = 0
with swt.profile() as prof:
    for i in range(int(sys.argv[2])):
        with prof.step():
''' + textwrap.indent(STEP_BODY, " " * 12) + '''        n += 1
json.dump({"train": n, "eval": 0}, open(sys.argv[1], "w"))
'''

# No DataLoader, no marks: steps are delimited by optimizer.step(); two optimizers a step (a GAN's), the first
# one's steps are the loop's.
OPTIMIZERS = '''
import json, sys, time
import torch
torch.set_num_threads(1)
model, critic = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
opt_critic = torch.optim.SGD(critic.parameters(), lr=0.01)
x = torch.ones(4)
n = 0
for i in range(int(sys.argv[2])):
    loss = critic(x).sum()
    opt_critic.zero_grad()
    loss.backward()
    opt_critic.step()
''' + textwrap.indent(STEP_BODY, " " * 4) + '''    n += 1
json.dump({"train": n, "eval": 0}, open(sys.argv[1], "w"))
'''

# No DataLoader, no optimizer: steps are forward/backward pairs with a manual update (PyTorch's "learning with
# examples" loops); now and then an evaluation of 20 forwards under no_grad, and a no-grad forward inside each step.
PAIRS = '''
import json, sys, time
import torch
torch.set_num_threads(1)
model, target = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
x = torch.ones(4)
train, evals = 0, 0
''' + BUSY + '''for i in range(int(sys.argv[2])):
    y = model(x)
    with torch.no_grad():
        goal = target(x)
    loss = (y - goal).pow(2).sum()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
    busy(150)
    train += 1
    if i % 1000 == 999:
        with torch.no_grad():
            for _ in range(20):
                model(x)
                busy(150)
                evals += 1
json.dump({"train": train, "eval": evals}, open(sys.argv[1], "w"))
'''

# Mixed precision's loop: a GradScaler steps the optimizer, and skips the update now and then (an overflow); its
# scaler.step() ends the iteration either way.
SCALER = '''
import json, sys, time
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", growth_interval=100)
x = torch.ones(4)
n, skipped = 0, 0
''' + BUSY + '''for i in range(int(sys.argv[2])):
    loss = model(x).sum()
    if i % 500 == 7:
        loss = loss * float("inf")  # an overflow: the scaler skips this update
    opt.zero_grad()
    scaler.scale(loss).backward()
    scale = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    skipped += scaler.get_scale() < scale
    busy(150)
    n += 1
assert skipped >= 10, skipped
json.dump({"train": n, "eval": 0}, open(sys.argv[1], "w"))
'''


def _run(tmp_path, source: str, *flags: str, steps: int = 6000):
    script = tmp_path / "job.py"
    script.write_text(source)
    out = tmp_path / "run"
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(out), "--flush-interval", "1", *flags, "--",
                sys.executable, str(script), str(tmp_path / "ran.json"), str(steps), timeout=180)
    assert p.returncode == 0, p.stderr
    return out, json.loads((tmp_path / "ran.json").read_text())


@pytest.mark.parametrize("source", [LOADER_EPOCHS, MARKS, OPTIMIZERS, PAIRS, SCALER],
                         ids=["loader-epochs-and-eval", "explicit-marks", "two-optimizers", "forward-backward-pairs",
                              "grad-scaler-skipping-updates"])
def test_sampled_steps_are_all_counted_with_their_numbers_and_the_timed_ones_are_whole(tmp_path, source):
    out, ran = _run(tmp_path, source, "--sample-steps-above", "500")
    events = open_run(str(out)).framework().to_pylist()
    steps = [e for e in events if e["kind"] == STEP]
    untimed = [e for e in events if e["kind"] == UNTIMED]
    counted = Counter()
    for u in untimed:
        counted[u["mode"]] += json.loads(u["args"])["steps"]
    timed = Counter(e["mode"] for e in steps)
    expected = {TRAIN: ran["train"], **({EVAL: ran["eval"]} if ran["eval"] else {})}
    assert untimed and sum(counted.values()) > sum(timed.values())  # sampled, mostly counted
    assert {m: timed[m] + counted[m] for m in expected} == expected
    for mode, n in expected.items():  # timed and counted steps together take each number once
        numbers = [e["step"] for e in steps if e["mode"] == mode]
        for u in untimed:
            if u["mode"] == mode:
                first = json.loads(u["args"])["first"]
                numbers.extend(range(first, first + json.loads(u["args"])["steps"]))
        assert sorted(numbers) == list(range(n)), mode
    _phase_sums_fit_their_steps(events)
    assert all(e["step"] is not None for e in events if e["kind"] in ("forward", "backward", "optimizer")), \
        "a phase outside its step: one seen while steps were counted"
    analysis = RunAnalysis(str(out))
    assert analysis.summary.steps == expected
    assert analysis.summary.loop.steps == sum(expected.values())
    assert 0 < analysis.summary.timed_share < 0.5
    stats = analysis.step_stats()  # per rank and mode: the timed steps' figures, and the counted ones beside
    assert sum(s.steps + s.untimed for s in stats if s.mode in expected) + \
        sum(counted[m] for m in expected if m not in {s.mode for s in stats}) == sum(expected.values())
    assert any("were counted, not timed" in n for n in analysis.notes), analysis.notes


def test_with_sampling_off_every_step_is_timed(tmp_path):
    out, ran = _run(tmp_path, MARKS, "--sample-steps-above", "0", steps=3000)
    events = open_run(str(out)).framework(kinds=[STEP, UNTIMED]).to_pylist()
    assert not [e for e in events if e["kind"] == UNTIMED]
    assert Counter(e["mode"] for e in events) == {TRAIN: ran["train"]} == {TRAIN: 3000}
    assert RunAnalysis(str(out)).summary.timed_share == 1.0


@pytest.fixture
def hooks():
    from stallwatch.config import ProfilerConfig
    from stallwatch.torch.session import Session

    session = Session(ProfilerConfig(), None, None)
    session.install_hooks()
    yield session.hooks
    session.close()
    session.hooks.uninstall()


def _train_loop(steps: int) -> None:
    import torch

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in torch.utils.data.DataLoader(torch.ones(steps, 2), batch_size=1):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


def test_between_stretches_the_per_step_hooks_are_off_the_classes_and_come_back(hooks):
    """Off: the job runs torch's own functions; back on from the timer's thread, except the optimizer's global hooks,
    which torch iterates in the training thread: those come back there, when timing resumes."""
    import torch
    from torch.optim import optimizer as optim
    from torch.utils.data import dataloader as tdl

    _train_loop(8)  # the model is found; the class wrappers go on
    assert hooks.can_disarm and hooks._hot
    wrapped = {(owner, name): getattr(owner, name) for owner, name, _, _ in hooks._hot}
    registered = len(optim._global_optimizer_pre_hooks)
    hooks.disarm()
    assert all(getattr(owner, name) is original for owner, name, original, _ in hooks._hot)
    assert tdl._BaseDataLoaderIter.__next__ is wrapped[(tdl._BaseDataLoaderIter, "__next__")].__stallwatch_original__
    assert len(optim._global_optimizer_pre_hooks) == registered - 1
    hooks.arm()
    assert {(o, n): getattr(o, n) for o, n, _, _ in hooks._hot} == wrapped
    assert len(optim._global_optimizer_pre_hooks) == registered - 1  # not from the timer's thread
    hooks.arm_optimizer()
    assert len(optim._global_optimizer_pre_hooks) == registered
    assert torch.autograd.backward is wrapped[(torch.autograd, "backward")]


def test_in_a_loop_of_pairs_the_models_forward_and_backward_stay_and_count(hooks):
    """Paused in a loop of forward/backward pairs the model's forward wrapper and backward's are what count the steps:
    they stay on; every other per-step hook comes off."""
    import torch
    from torch.utils.data import dataloader as tdl

    _train_loop(8)
    wrapped = {(owner, name): getattr(owner, name) for owner, name, _, _ in hooks._hot}
    hooks.disarm(keep_pairs=True)
    try:
        assert torch.autograd.backward is wrapped[(torch.autograd, "backward")]
        assert torch.nn.Linear.forward is wrapped[(torch.nn.Linear, "forward")]
        loader_next = wrapped[(tdl._BaseDataLoaderIter, "__next__")]
        assert tdl._BaseDataLoaderIter.__next__ is loader_next.__stallwatch_original__
    finally:
        hooks.arm()
    assert {(o, n): getattr(o, n) for o, n, _, _ in hooks._hot} == wrapped


def test_in_an_optimizer_loop_a_grad_scalers_step_stays_and_counts(hooks):
    """Paused in a loop the optimizer delimits, a GradScaler's step stays on with the optimizer's hooks: it counts
    the iteration's update, the ones it skips included; every other per-step hook comes off."""
    from torch.amp.grad_scaler import GradScaler
    from torch.utils.data import dataloader as tdl

    _train_loop(8)
    wrapped = {(owner, name): getattr(owner, name) for owner, name, _, _ in hooks._hot}
    hooks.disarm(keep_optimizer=True)
    try:
        assert GradScaler.step is wrapped[(GradScaler, "step")]
        loader_next = wrapped[(tdl._BaseDataLoaderIter, "__next__")]
        assert tdl._BaseDataLoaderIter.__next__ is loader_next.__stallwatch_original__
    finally:
        hooks.arm()
    hooks.disarm()
    try:
        assert GradScaler.step is wrapped[(GradScaler, "step")].__stallwatch_original__
    finally:
        hooks.arm()
    assert {(o, n): getattr(o, n) for o, n, _, _ in hooks._hot} == wrapped


def test_someone_elses_patch_over_a_hook_is_never_undone(hooks):
    from torch.utils.data import dataloader as tdl

    _train_loop(4)
    ours = tdl._BaseDataLoaderIter.__next__

    def theirs(it):
        return ours(it)

    tdl._BaseDataLoaderIter.__next__ = theirs
    try:
        assert not hooks.can_disarm  # so steps are never sampled: each pause would end at the next batch
        hooks.disarm()
        assert tdl._BaseDataLoaderIter.__next__ is theirs
        hooks.arm()
        assert tdl._BaseDataLoaderIter.__next__ is theirs
    finally:
        tdl._BaseDataLoaderIter.__next__ = ours


def test_steps_are_sampled_only_where_they_can_be_counted(hooks):
    from stallwatch.torch.sampling import StepSampling
    from stallwatch.torch.steps import EXPLICIT, LOADER, OPTIMIZER_SOURCE, PAIRS

    _train_loop(4)
    tracker = hooks.tracker
    sampling = StepSampling(500, tracker, hooks)
    tracker.listener = None
    for source, allowed in [(LOADER, True), (EXPLICIT, True), (OPTIMIZER_SOURCE, True), (PAIRS, True), (None, False)]:
        tracker.source = source
        assert sampling._allowed() is allowed, source
    tracker.source = LOADER
    tracker.listener = object()  # a profiling window due, a new configuration: every step is needed
    assert not sampling._allowed()
    tracker.listener = None
    tracker.several_loaders = True
    assert not sampling._allowed()


ONE_OPTIMIZER = '''
import json, sys, time
import torch
from torch.optim import optimizer as optim
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.ones(4)
n, seen = 0, set()
for i in range(int(sys.argv[2])):
''' + textwrap.indent(STEP_BODY, " " * 4) + '''    n += 1
    if i % 50 == 0:
        code = optim.Optimizer._optimizer_step_code
        seen.add((len(optim._global_optimizer_pre_hooks) + len(optim._global_optimizer_post_hooks),
                  code.__module__.split(".")[0]))
json.dump({"train": n, "eval": 0, "seen": sorted(seen)}, open(sys.argv[1], "w"))
'''


def test_between_stretches_an_optimizer_loop_runs_without_hooks_and_counts_in_torchs_step_code(tmp_path):
    """Paused in a loop `optimizer.step()` delimits, the optimizer's two global hooks come off and the steps are
    counted in torch's own per-step call (`Optimizer._optimizer_step_code`, a no-op torch calls in every step),
    torch's one coming back with the hooks when timing resumes: every step counted, each number once. The two
    hook calls a step were most of what such a loop of 30 µs steps paid between stretches."""
    out, ran = _run(tmp_path, ONE_OPTIMIZER, "--sample-steps-above", "500", steps=8000)
    seen = {tuple(s) for s in ran["seen"]}
    assert (0, "stallwatch") in seen, seen  # paused: no hook, the count in the step code
    assert (2, "torch") in seen, seen  # timed: torch's step code, the two hooks
    events = open_run(str(out)).framework().to_pylist()
    numbers = [e["step"] for e in events if e["kind"] == STEP]
    for u in (e for e in events if e["kind"] == UNTIMED):
        first = json.loads(u["args"])["first"]
        numbers.extend(range(first, first + json.loads(u["args"])["steps"]))
    assert sorted(numbers) == list(range(8000))
