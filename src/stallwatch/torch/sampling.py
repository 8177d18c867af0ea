"""Sampled steps: where steps last microseconds, timing each one costs the job more than 2 % (a few µs of hooks
per step, see docs/benchmarks.md). Above `sample_steps_above_per_s` a rank's steps are timed for TIMED_S of
every PERIOD_S and only counted in between, with the per-step hooks off the classes (the job runs bare):

- A stretch of timed steps starts at the first step boundary after each second of the wall clock (every rank
  samples about the same step numbers, so Straggler can compare them) and ends at the first boundary TIMED_S on,
  or sooner where TIMED_STEPS of the rank's paused steps take less (a loop of 30 µs steps: ~3 ms).
- Counting is exact: a DataLoader's iterator counts its batches itself; explicit marks (`prof.step()`, Keras)
  add one each; in a loop delimited by `optimizer.step()` the optimizer's global hooks stay on, reduced to
  counting its first optimizer's steps (with a GradScaler, its `scaler.step(optimizer)` counts them, the updates it
  skips included; a forward under no_grad between stretches, which such a loop counts as an evaluation step, is
  then unseen); in a loop of forward/backward pairs (no optimizer, a manual update) the model's
  forward wrapper and backward's stay on, reduced to counting the steps each top-level forward begins (a TRAIN one
  after a backward, an EVAL one under no_grad outside a training step, as when timed). The counted steps take their
  step numbers in order and are recorded as `untimed` markers.
- Not sampled: a loop whose steps each take batches from several
  loaders (`zip(a, b)`: batches would count twice), and none while anything needs each step (a profiling window,
  a new configuration, the model being looked for, DDP's timings) or with a compiled model's hooks.
- Sampling starts as soon as RATE_EVERY timed steps ran faster than the threshold (a few ms into a fast loop),
  and stops when a stretch's rate falls under half of it; it starts again the same way."""

from __future__ import annotations

import threading
import time

from stallwatch.log import warn_once
from stallwatch.torch.steps import EXPLICIT, LOADER, OPTIMIZER_SOURCE, PAIRS, RATE_EVERY, StepTracker, now_us

PERIOD_S = 1.0
TIMED_S = 0.01  # 1 % of the time timed: at 20 µs steps (+15 µs each timed) about 0.75 % of the job
# ... and at most about this many steps a stretch (at the rate the paused steps ran): a 30 µs loop's 10 ms held
# 200–300 timed steps a second, each +50 % (job CPU +0.5–1 % of the 2 % allowed); 100 a second are plenty for
# the rules' medians and shares (6,000 a minute), and every step is still counted.
TIMED_STEPS = 100


class StepSampling:
    """Owned by the session. Deciding and pausing (at a step boundary) run on the training thread; re-arming on a
    timer's daemon thread, alive only while sampling."""

    def __init__(self, above_per_s: float, tracker: StepTracker, hooks: object) -> None:
        self.above = float(above_per_s)
        self.tracker = tracker
        self.hooks = hooks  # TorchHooks: arm(), disarm(), armed, can_disarm, count_paused()
        self.active = False
        self.stretches = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._last_us = 0
        self._timed_s = TIMED_S  # this rank's stretch: TIMED_S, or TIMED_STEPS of its paused steps when shorter
        tracker.on_rate = self._rate
        tracker.on_pause = self._paused
        tracker.on_resume = self._resumed
        tracker.count_paused = hooks.count_paused  # type: ignore[attr-defined]

    def _rate(self, end_us: int) -> None:
        """The training thread, at the first timed step and every RATE_EVERY after: start sampling when they came
        faster than the threshold."""
        last, self._last_us = self._last_us, end_us
        if self.active or self._closed or not last or end_us <= last:
            return
        if RATE_EVERY * 1e6 > self.above * (end_us - last) and self._allowed():
            self._start()

    def _allowed(self) -> bool:
        t = self.tracker
        if t.source == OPTIMIZER_SOURCE:  # counted by the optimizer's own hook, or by a GradScaler's step around it
            source_ok = True
        else:
            source_ok = t.source in (LOADER, EXPLICIT, PAIRS) and not t.several_loaders
        return source_ok and t.listener is None and self.hooks.can_disarm  # type: ignore[attr-defined]

    def _start(self) -> None:
        self.active = True
        self.hooks.probe.sampled = True  # type: ignore[attr-defined]  # its windows then average over both
        self.tracker.pause_after_us = now_us()  # the next step boundary pauses; the timer resumes
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="stallwatch-sampling", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self.active = False
        self.hooks.probe.sampled = False  # type: ignore[attr-defined]
        self.tracker.pause_after_us = 0

    def close(self) -> None:
        """At exit (training thread): the hooks back on, so that the tracker's last step is seen whole."""
        self._closed = True
        self.stop()
        self.hooks.arm()  # type: ignore[attr-defined]
        self.hooks.arm_optimizer()  # type: ignore[attr-defined]

    # -- the training thread ----------------------------------------------------------------------------
    def _paused(self, _t: int) -> None:
        # In an optimizer-delimited loop the pause begins inside the optimizer's hooks: they stay, and count; in a
        # loop of forward/backward pairs the model's forward and backward stay, and count.
        source = self.tracker.source
        self.hooks.disarm(keep_optimizer=source == OPTIMIZER_SOURCE,  # type: ignore[attr-defined]
                          keep_pairs=source == PAIRS)

    def _resumed(self, steps: int, paused_us: int) -> None:
        self.hooks.arm_optimizer()  # type: ignore[attr-defined]  # here: never while torch iterates them
        self.stretches += 1
        if steps > 0 and paused_us > 0:
            self._timed_s = min(TIMED_S, TIMED_STEPS * paused_us / steps / 1e6)
        if not self.active:
            return
        if steps * 1e6 < paused_us * self.above / 2 or not self._allowed():
            self.stop()  # slower now, or something needs every step: time them all

    # -- the timer's thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            waited = 0
            while self.active and not self._closed:
                now = time.time()
                boundary = (int(now / PERIOD_S) + 1) * PERIOD_S
                time.sleep(boundary - now)
                tracker = self.tracker
                if tracker.paused_at is None or self.hooks.armed:  # type: ignore[attr-defined]
                    # Still timing (no boundary since), or paused but not yet unhooked: next second. Paused with
                    # the hooks on for a whole period: the loop left its boundaries; the next phase resumes.
                    waited = waited + 1 if tracker.paused_at is not None else 0
                    if waited >= 2:
                        tracker.resume_any = True
                    continue
                waited = 0
                if not self.active or self._closed:
                    break
                tracker.pause_after_us = int((boundary + self._timed_s) * 1e6)
                self.hooks.arm()  # type: ignore[attr-defined]
                tracker.rearmed = True  # after: a mark before the hooks are all back is counted, not timed
        except Exception as exc:  # never into the job; the hooks go back on, every step timed
            warn_once("sampling", "stallwatch's step sampling stopped (%s: %s); every step is timed",
                      type(exc).__name__, exc)
            self.stop()
            self.hooks.arm()  # type: ignore[attr-defined]
            self.tracker.resume_any = True  # the training thread resumes (and re-registers) at its next call
