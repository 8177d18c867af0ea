"""The hooks time their own work in short windows: the user's code they call is not theirs, a re-entered wrapper
keeps its own tally, and outside windows nothing is timed. A fake clock makes every figure exact."""

from __future__ import annotations

import sys

import pytest

from stallwatch.torch import probe as probe_mod
from stallwatch.torch.probe import EVERY_S, FIRST_AFTER_S, WINDOW_S, Probe


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000

    def __call__(self) -> int:
        return self.ns

    def spend(self, ns: int) -> None:
        self.ns += ns


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(probe_mod, "_perf", c)
    return c


def _wrapper(probe: Probe, clock: Clock, own_before: int, own_after: int):
    """A hook that spends `own_before` ns, calls the user's function, then spends `own_after` ns."""
    def build(original, probed):
        def hook(*args):
            if probed is not None and probe.on:
                return probed(*args)
            clock.spend(own_before)
            try:
                return original(*args)
            finally:
                clock.spend(own_after)
        return hook
    return build


def test_a_window_counts_the_hooks_own_time_not_the_users_code(clock):
    probe = Probe()
    user_calls = []

    def user(x):
        user_calls.append(x)
        clock.spend(1_000_000)  # the user's millisecond
        return x * 2

    hook = probe.wrap(_wrapper(probe, clock, 3_000, 2_000), user)
    assert hook(1) == 2 and probe.calls == 0  # no window open: nothing timed
    probe.open()
    clock.spend(7_000)  # the loop's own code before the first call
    assert [hook(i) for i in range(4)] == [0, 2, 4, 6]
    probe.finish()
    assert user_calls == [1, 0, 1, 2, 3]  # the user's function ran once per call, probed or not
    assert (probe.own_ns, probe.calls) == (4 * 5_000, 4)
    assert probe.window_ns == 7_000 + 4 * 1_005_000  # the window's whole span


def test_a_re_entered_wrapper_keeps_its_own_tally(clock):
    """A model whose forward calls the same class's forward (a wrapped submodule of the same type): each level
    counts its own time once, and the user's time in between not at all."""
    probe = Probe()
    depth = []

    def user(n):
        clock.spend(100_000)
        if n:
            depth.append(n)
            return hook(n - 1)
        return 0

    hook = probe.wrap(_wrapper(probe, clock, 1_000, 1_000), user)
    probe.open()
    hook(2)
    probe.finish()
    assert depth == [2, 1]
    assert (probe.own_ns, probe.calls) == (3 * 2_000, 3)


def test_a_failing_users_call_is_still_timed_and_still_raises(clock):
    probe = Probe()

    def user():
        clock.spend(50_000)
        raise KeyError("theirs")

    hook = probe.wrap(_wrapper(probe, clock, 1_000, 0), user)
    probe.open()
    with pytest.raises(KeyError, match="theirs"):
        hook()
    assert (probe.own_ns, probe.calls) == (1_000, 1)


def test_measured_hooks_are_timed_whole_only_in_a_window(clock):
    probe = Probe()
    hook = probe.measured(lambda: clock.spend(700))
    hook()
    probe.open()
    hook()
    hook()
    assert (probe.own_ns, probe.calls) == (1_400, 2)
    bypassed = probe.measured(lambda: clock.spend(700), bypass=lambda: True)  # torch.compile tracing it
    bypassed()
    assert probe.calls == 2


def test_windows_open_every_few_seconds_and_last_a_quarter_second():
    probe = Probe()
    t = probe._next
    probe.tick(t - 0.01)
    assert not probe.on
    probe.tick(t)
    assert probe.on
    probe.tick(t + WINDOW_S / 2)
    assert probe.on
    probe.tick(t + WINDOW_S)
    assert not probe.on
    probe.tick(t + EVERY_S - 0.01)
    assert not probe.on
    probe.tick(t + EVERY_S)
    assert probe.on
    assert FIRST_AFTER_S < EVERY_S and WINDOW_S / EVERY_S <= 0.05  # timing costs only in a small share of the time


def test_a_window_without_a_hook_call_counts_for_nothing(clock):
    """A window while the loop was elsewhere (loading, evaluating without hooks) says nothing about the loop."""
    probe = Probe()
    probe.open()
    clock.spend(250_000_000)
    probe.finish()
    assert probe.window_ns == 0
    probe.open()
    clock.spend(1_000)
    probe.account(500)
    clock.spend(249_000_000)
    probe.finish()
    probe.finish()  # closing twice counts once
    assert (probe.window_ns, probe.own_ns) == (249_001_000, 500)


def test_while_steps_are_sampled_a_window_without_a_hook_call_counts(clock):
    """Sampled steps: the hooks are off most of each second, and a window that fell between two timed stretches
    is part of the average (counting only windows with calls would read a stretch's cost as the loop's)."""
    probe = Probe()
    probe.sampled = True
    probe.open()
    clock.spend(250_000_000)
    probe.finish()
    assert (probe.window_ns, probe.own_ns) == (250_000_000, 0)


SHORT_STEPS_JOB = '''
import sys, time, torch
from torch.utils.data import DataLoader
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(64, 4)
steps, stop = 0, time.monotonic() + 4.0  # past the first window (FIRST_AFTER_S + WINDOW_S)
while time.monotonic() < stop:
    for x in DataLoader(data, batch_size=8):
        model(x).sum().backward(); opt.step(); opt.zero_grad()
        steps += 1
open(sys.argv[1], "w").write(str(steps))
'''


def test_a_real_job_of_short_steps_records_what_stallwatch_cost_it_and_every_step(tmp_path):
    """Probed or not, each step is recorded once; the job's `overhead` record reads back as its rank's cost."""
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.records import OVERHEAD, STEP

    from ..collect._support import stallwatch as run_cli

    (tmp_path / "job.py").write_text(SHORT_STEPS_JOB)
    out = tmp_path / "run"
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(out), "--sample-steps-above", "0", "--",
                sys.executable, "job.py", "steps.txt")  # every step timed (sampled steps: test_sampling.py)
    assert p.returncode == 0, p.stderr
    analysis = RunAnalysis(str(out))
    events = analysis.run.framework(kinds=[STEP, OVERHEAD]).to_pylist()
    assert sum(e["kind"] == STEP for e in events) == int((tmp_path / "steps.txt").read_text())
    assert all(e["start_us"] == e["end_us"] for e in events if e["kind"] == OVERHEAD)  # moments, not spans
    [cost] = analysis.hook_costs
    assert (cost.node, cost.rank) == (analysis.nodes[0], 0)
    assert cost.calls > 0 and cost.own_ns > 0 and cost.window_ns >= cost.own_ns and cost.sender_ns >= 0
    assert 0 < cost.share < 1
    said = [n for n in analysis.notes if n.startswith("stallwatch took at least")]
    assert len(said) == (1 if cost.share >= 0.02 and cost.window_ns >= 10**8 else 0)


COMPILED_JOB = '''
import sys, time, torch
import torch._dynamo.utils as u
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=8)
for xb in data:  # eager first: stallwatch wraps the model's class, which the compiled code then traces
    opt.zero_grad(); model(xb).sum().backward(); opt.step()
compiled = torch.compile(model, backend="eager")
loss_of = torch.compile(lambda x: model(x).sum(), backend="eager")
from stallwatch.torch import session
probe = session.current().hooks.probe
# Across a window: the hooks' flag flips while compiled code runs. Windows open every 10 s from 2 s after the
# session began, so a fixed 4 s missed them all when a loaded machine made the start and the compile slow: the
# loop runs 4 s and on until a window has opened and closed inside it.
first, seen, t0 = None, probe.window_ns, time.monotonic()
while time.monotonic() < t0 + 4.0 or (probe.window_ns == seen and time.monotonic() < t0 + 120):
    for xb in data:
        opt.zero_grad(); (compiled(xb).sum() + loss_of(xb)).backward(); opt.step()
        first = first if first is not None else u.counters["stats"]["unique_graphs"]
print("graphs", first, u.counters["stats"]["unique_graphs"], probe.window_ns - seen, flush=True)
'''


def test_compiled_code_is_not_recompiled_when_a_window_opens_or_closes(tmp_path):
    """torch.compile guards on what it reads while tracing the hooks: the window flag is read only after the
    hooks have stepped aside for the compiler, so the flag flipping recompiles nothing."""
    from stallwatch.analyze.analysis import RunAnalysis

    from ..collect._support import stallwatch as run_cli

    (tmp_path / "job.py").write_text(COMPILED_JOB)
    out = tmp_path / "run"
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(out), "--", sys.executable, "job.py", timeout=180)
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.decode().splitlines() if ln.startswith("graphs"))
    _, before, after, window_ns = line.split()
    assert int(window_ns) > 0, line  # a window opened and closed while the compiled code ran
    assert int(before) >= 1 and after == before, line
    [cost] = RunAnalysis(str(out)).hook_costs
    assert cost.window_ns > 0  # a window did open while the compiled code ran


def test_a_window_open_at_a_fork_is_closed_in_the_child(monkeypatch):
    """Nothing ticks in a forked child (no event thread): a window left open would time its hooks forever."""
    import os
    from types import SimpleNamespace

    from stallwatch.torch import session

    probe = Probe()
    probe.open()
    fake = SimpleNamespace(hooks=SimpleNamespace(enabled=True, probe=probe))
    monkeypatch.setattr(session, "_session", fake)
    pid = os.fork()
    if pid == 0:  # the child: report what it inherited, and leave without running the parent's exit hooks
        os._exit(0 if not probe.on and not fake.hooks.enabled else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert probe.on  # the parent's window stays open
