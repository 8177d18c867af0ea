"""Loop shapes seen on real public scripts, run as real jobs under `stallwatch run`: exact step counts per
phase, and phase times that add up (a closure's forward/backward are not optimizer time)."""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.records import BACKWARD, EVAL, FORWARD, LOOP, OPTIMIZER, STEP, TRAIN
from stallwatch.store.reader import open_run

from ..collect._support import stallwatch as run_cli
from . import loop_shapes


def _profile(tmp_path, source: str):
    script = tmp_path / "job.py"
    script.write_text(source)
    out = tmp_path / "run"
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(out), "--flush-interval", "1", "--",
                sys.executable, str(script), str(tmp_path / "ran.json"))
    ran = json.loads((tmp_path / "ran.json").read_text())
    events = open_run(str(out)).framework().to_pylist()
    return p, out, ran, events


def _steps(events) -> Counter:
    return Counter(e["mode"] for e in events if e["kind"] == STEP)


def _phase_sums_fit_their_steps(events) -> None:
    """Per step, the phases' time is within the step's (nothing counted twice)."""
    steps = {(e["mode"], e["step"]): e["end_us"] - e["start_us"] for e in events if e["kind"] == STEP}
    phases: Counter = Counter()
    for e in events:
        if e["kind"] in (FORWARD, BACKWARD, OPTIMIZER) and e["step"] is not None:
            phases[(e["mode"], e["step"])] += e["end_us"] - e["start_us"]
    for key, total in phases.items():
        assert total <= steps[key] + 2, (key, total, steps[key])


def test_manual_sgd_with_a_periodic_estimate_loss(tmp_path):
    p, out, ran, events = _profile(tmp_path, loop_shapes.MANUAL_SGD)
    assert p.returncode == 0, p.stderr
    assert _steps(events) == {TRAIN: ran["train"], EVAL: ran["eval"]} == {TRAIN: 20, EVAL: 12}
    train_forwards = [e for e in events if e["kind"] == FORWARD and e["mode"] == TRAIN]
    assert len(train_forwards) == 20  # the evaluation's forwards are not charged to training
    assert {e["step"] for e in events if e["kind"] == BACKWARD} == set(range(20))
    assert [e["name"] for e in events if e["kind"] == LOOP] == ["pairs"]
    _phase_sums_fit_their_steps(events)
    notes = RunAnalysis(str(out)).notes
    assert any("forward and its backward was counted as one training step" in n for n in notes), notes


def test_lbfgs_closure_is_one_step_per_optimizer_step_and_not_all_optimizer(tmp_path):
    p, _, ran, events = _profile(tmp_path, loop_shapes.LBFGS)
    assert p.returncode == 0, p.stderr
    assert _steps(events) == {TRAIN: ran["train"]} == {TRAIN: 6}
    _phase_sums_fit_their_steps(events)
    time = Counter()
    for e in events:
        if e["kind"] in (FORWARD, BACKWARD, OPTIMIZER):
            time[e["kind"]] += e["end_us"] - e["start_us"]
    assert time[FORWARD] + time[BACKWARD] > 0 and time[OPTIMIZER] > 0
    assert sum(1 for e in events if e["kind"] == FORWARD) >= 6 * 2  # several closure calls per step


def test_a_loss_module_under_no_grad_is_not_a_step_of_its_own(tmp_path):
    """time_sequence_prediction read "EVAL 3 for 2": while the model was being looked for, its evaluation's loss
    module (no parameters) called under no_grad was a top-level forward, so an EVAL step of its own."""
    p, _, ran, events = _profile(tmp_path, loop_shapes.TIME_SEQUENCE)
    assert p.returncode == 0, p.stderr
    assert _steps(events) == {TRAIN: ran["train"], EVAL: ran["eval"]} == {TRAIN: 4, EVAL: 4}
    assert {e["name"] for e in events if e["kind"] == FORWARD} == {"Sequential"}  # the loss is no forward phase
    _phase_sums_fit_their_steps(events)


def test_gradient_accumulation_without_a_data_loader(tmp_path):
    p, _, ran, events = _profile(tmp_path, loop_shapes.ACCUMULATION)
    assert p.returncode == 0, p.stderr
    assert _steps(events) == {TRAIN: ran["train"]} == {TRAIN: 8}
    assert Counter(e["step"] for e in events if e["kind"] == FORWARD) == {s: 4 for s in range(8)}
    assert [e["name"] for e in events if e["kind"] == LOOP] == ["optimizer"]


def test_a_step_interrupted_by_ctrl_c_is_a_train_step_not_an_eval_step(tmp_path):
    p, out, ran, events = _profile(tmp_path, loop_shapes.INTERRUPTED)
    assert p.returncode != 0
    assert ran["train"] == 5
    assert _steps(events) == {TRAIN: 6}  # five whole steps and the one cut short
    assert RunAnalysis(str(out)).summary.fate.interrupted


@pytest.mark.parametrize("source", ["FORWARD_ONLY"])
def test_a_loop_whose_boundary_cannot_be_found_says_so(tmp_path, source):
    p, out, _, events = _profile(tmp_path, getattr(loop_shapes, source))
    assert p.returncode == 0, p.stderr
    assert [e["name"] for e in events if e["kind"] == LOOP] == ["undetermined"]
    analysis = RunAnalysis(str(out))
    assert any("iteration boundary could not be found" in n and "12 top-level forward calls" in n
               for n in analysis.notes), analysis.notes
    assert analysis.findings.verdict.startswith("Inconclusive") and not analysis.findings.healthy


def test_a_wait_after_the_update_is_in_the_step_not_between_steps(tmp_path):
    """Steps delimited by optimizer.step() ended at it: a GPU loop's `loss.item()` (the wait for the step's kernels)
    and the next batch built by hand fell between steps (on an H100, 4.8 ms steps for 67.5 ms iterations)."""
    p, out, ran, events = _profile(tmp_path, loop_shapes.SYNC_AFTER_UPDATE)
    assert p.returncode == 0, p.stderr
    steps = sorted((e["step"], e["start_us"], e["end_us"]) for e in events if e["kind"] == STEP)
    assert len(steps) == ran["train"] == 12
    assert all(a[2] == b[1] for a, b in zip(steps, steps[1:]))  # contiguous: nothing between steps
    # each step holds its iteration's wait, and together they take the loop's own wall time: a step runs from one
    # forward to the next, an iteration from one top of the loop to the next, so their sums differ only by two
    # batch buildings (a few ms on a busy machine)
    inner = [end - start for _, start, end in steps[1:-1]]
    assert all(d >= 20_000 for d in inner), inner
    assert abs(sum(inner) - sum(ran["iterations_us"][1:-1])) <= max(5_000, 0.05 * sum(inner)), (inner, ran)
    _phase_sums_fit_their_steps(events)


def test_a_gan_without_a_data_loader_is_one_step_per_iteration(tmp_path):
    """Two optimizers per iteration, one of them wrapping another: 10 steps for 10 iterations (was 20, and a
    wrapped optimizer's inner step would have counted again)."""
    p, out, ran, events = _profile(tmp_path, loop_shapes.GAN_TWO_OPTIMIZERS)
    assert p.returncode == 0, p.stderr
    assert _steps(events) == {TRAIN: ran["train"]} == {TRAIN: 10}
    per_step = Counter(e["step"] for e in events if e["kind"] == OPTIMIZER)
    assert set(per_step.values()) == {2}  # the discriminator's and the (outer) generator's, once each
    _phase_sums_fit_their_steps(events)



def test_iterations_whose_update_a_grad_scaler_skips_are_steps_of_their_own(tmp_path):
    """scaler.step() skips optimizer.step() when the gradients overflow: such an iteration still ends at its
    scaler.step() (was: the first ones held as one gradient-accumulation step, a later one merged into the next)."""
    p, out, ran, events = _profile(tmp_path, loop_shapes.AMP_SKIPPED_STEPS)
    assert p.returncode == 0, p.stderr
    assert _steps(events) == {TRAIN: ran["train"]} == {TRAIN: 12}
    per_step = Counter(e["step"] for e in events if e["kind"] == OPTIMIZER)
    assert sorted(per_step) == list(range(12)) and set(per_step.values()) == {1}
    _phase_sums_fit_their_steps(events)
