"""Always-on framework layer: what stallwatch's hooks (DataLoader `__next__`, the model's forward, backward,
optimizer step, events sent to a live sampler) add to each training step, side by side in one run with the
bare loop, torch.profiler with minimal settings and Lightning's SimpleProfiler.

Targets (issue): <= 20 µs per step, and <= 1 % slowdown of a ~5 ms CPU step. Published comparison point:
TraceML costs 0.17-0.58 ms per step.

Run: python benchmarks/framework_overhead.py [--quick] [--rounds R] [--steps N] [--micro-steps M] [--breakdown]

Method
------
* A real loop: DataLoader(num_workers=0) over an in-memory TensorDataset (shuffled), an MLP, cross-entropy,
  SGD with momentum; `torch.set_num_threads(1)`. Two workloads in one run:
  - "~5 ms step": MLP 256-512-512-512-10, batch 128 (about 5 ms a step on one core): the % target.
  - "micro step": MLP 32-32-10, batch 8: the smallest real loop (about 0.2-0.3 ms a step on a 2-core VM:
    batch fetch and collate, autograd and SGD have a fixed cost), so a fixed per-step cost stands out; the
    µs-per-step target is read here.
* A step is one loop iteration, `next(iterator)` included (what a user's loop pays), timed with
  perf_counter_ns between iteration ends; an epoch boundary (new iterator) falls inside some steps, so the
  mean includes it, the median does not.
* Variants run in interleaved rounds in one process (round r starts at variant r mod V: every variant runs
  at every position), each run = a few warm-up steps, then N timed steps. Per variant: median and mean of
  all timed steps pooled over rounds; overhead = variant − bare, and the per-round paired difference
  (variant's round median − the same round's bare median) as median [p25, p75] over rounds (the noise).
* Variants:
  - bare: the loop as is, nothing installed.
  - stallwatch: the real thing. Each round enters `stallwatch.torch.profile(out=tmp/run-i, gpu=False)`:
    a sampler process is started, the event sender thread ships events to it over its Unix socket, the
    hooks are installed; after a 0.5 s pause (the sampler's start-up, a one-off) the run's steps are taken
    inside, and `__exit__` uninstalls everything (the next variant runs on an unhooked torch). Model
    discovery (global module hooks for the first 3 steps of a loop) happens during the warm-up steps: the
    timed steps are the steady state. The enter/exit cost is a one-off per job and reported apart (below
    the table), not per step. Default configuration: above 500 steps/s (the micro step) steps are sampled,
    timed 10 ms of every second and counted in between.
  - stallwatch, every step timed: the same with `sample_steps_above_per_s=0`, in a session of its own: what
    the hooks cost each step they time (the cost of every step below 500 steps/s, e.g. the ~5 ms step).
  - stallwatch, hooks off: the same session, `session.hooks.enabled = False` (every patched function is a
    pass-through, the sampler and sender thread stay): the cost of being installed but idle, for
    diagnosis. Runs right before or after "stallwatch" (alternating) inside the same profile(), after
    discovery is done (the model's own forward hooks stay, as pass-throughs).
  - torch.profiler (minimal): `torch.profiler.profile(activities=[CPU])` with every option off
    (record_shapes, profile_memory, with_stack, with_flops, with_modules = False), no schedule (it records
    every step), `prof.step()` after each step (its step marker, as stallwatch marks steps). `stop()`
    (which post-processes the events) is timed apart and shown amortized per step below the table.
  - Lightning SimpleProfiler: `SimpleProfiler().profile(action)` context managers around the same 18
    actions, nested the same way, that Lightning 2.6's fit loop wraps per training batch with no callbacks
    (read from a Trainer run: train_dataloader_next, batch_to_device with its 3 module hooks inside,
    on_train_batch_start x2, run_training_batch > optimizer_step > training_step, on_before_zero_grad,
    optimizer_zero_grad, on_before_backward, backward, on_after_backward, on_before_optimizer_step,
    configure_gradient_clipping, then on_train_batch_end). The hook bodies are empty here: only the
    profiler's cost is added, not Lightning's own loop machinery.
* Resolution: on a shared 2-core VM the ~5 ms rows drift by ~±100 µs between rounds, so they resolve a
  difference of roughly ±40 µs (~1 %) even with 24 rounds (see the p25/p75 column); the micro rows resolve
  a few µs. Read the µs cost from the micro rows and check the % from the ~5 ms rows.
* Also shown for stallwatch: the CPU its event-sender thread used per timed step (json-encoding and
  sending the events; it holds the GIL while encoding, so it mostly adds to the training thread's time
  and is already inside the step times).
* `--breakdown` adds where stallwatch's per-step time goes, in situ (micro step, real profile()): each
  hook method is wrapped in a perf_counter_ns timer (its own cost calibrated and subtracted). It times
  the hook bodies only, not the wrappers' frames, nor the slower nn.Module call path that any forward hook
  causes, nor the sender thread; what is left of the measured overhead is that.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, table  # noqa: E402

WARMUP_STEPS = 10
SETTLE_S = 0.5  # after profile() starts the sampler process (its start-up uses ~25 % of a core for ~0.3 s)
_RUN_IDS = itertools.count(1)  # each profile() records a new run


# -- the workload --------------------------------------------------------------------------------------
class Workload:
    """A model, its optimizer and a DataLoader; `steps(n)` runs n steps (a fresh iterator each call)."""

    def __init__(self, d_in: int, hidden: int, layers: int, batch: int, batches_per_epoch: int = 100) -> None:
        torch.manual_seed(0)
        mods: list[nn.Module] = [nn.Linear(d_in, hidden), nn.ReLU()]
        for _ in range(layers - 1):
            mods += [nn.Linear(hidden, hidden), nn.ReLU()]
        mods.append(nn.Linear(hidden, 10))
        self.model = nn.Sequential(*mods)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        n = batch * batches_per_epoch
        ds = torch.utils.data.TensorDataset(torch.randn(n, d_in), torch.randint(0, mods[-1].out_features, (n,)))
        self.loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=0)
        self.label = f"MLP {d_in}-" + "-".join([str(hidden)] * layers) + f"-{mods[-1].out_features}, batch {batch}"

    def steps(self, n: int, after_step: Callable[[], None] | None = None,
              before_step: Callable[[int], None] | None = None) -> list[int]:
        """Per-step ns of n plain training steps (`after_step()` runs at the end of each, e.g. prof.step();
        `before_step(i)` at the start of step i, before its batch is asked for)."""
        model, opt, loader = self.model, self.opt, self.loader
        out: list[int] = []
        it = iter(loader)
        clock = time.perf_counter_ns
        t_prev = clock()
        while len(out) < n:
            if before_step is not None:
                before_step(len(out))
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(loader)
                x, y = next(it)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if after_step is not None:
                after_step()
            t = clock()
            out.append(t - t_prev)
            t_prev = t
        return out

    def steps_lightning(self, n: int, prof) -> list[int]:
        """The same steps inside SimpleProfiler actions, as Lightning 2.6's fit loop wraps a batch."""
        model, opt, loader = self.model, self.opt, self.loader
        p = prof.profile
        lm, st = "[LightningModule]Model.", "[Strategy]SingleDeviceStrategy."
        out: list[int] = []
        it = iter(loader)
        clock = time.perf_counter_ns
        t_prev = clock()
        while len(out) < n:
            with p("[_TrainingEpochLoop].train_dataloader_next"):
                try:
                    x, y = next(it)
                except StopIteration:
                    it = iter(loader)
                    x, y = next(it)
            with p(st + "batch_to_device"):
                with p(lm + "on_before_batch_transfer"):
                    pass
                with p(lm + "transfer_batch_to_device"):
                    pass
                with p(lm + "on_after_batch_transfer"):
                    pass
            with p(lm + "on_train_batch_start"):
                pass
            with p(st + "on_train_batch_start"):
                pass
            with p("run_training_batch"):
                with p(lm + "optimizer_step"):
                    with p(lm + "on_before_zero_grad"):
                        pass
                    with p(lm + "optimizer_zero_grad"):
                        opt.zero_grad()
                    with p(st + "training_step"):
                        loss = F.cross_entropy(model(x), y)
                    with p(lm + "on_before_backward"):
                        pass
                    with p(st + "backward"):
                        loss.backward()
                    with p(lm + "on_after_backward"):
                        pass
                    with p(lm + "on_before_optimizer_step"):
                        pass
                    with p(lm + "configure_gradient_clipping"):
                        pass
                    opt.step()
            with p(lm + "on_train_batch_end"):
                pass
            t = clock()
            out.append(t - t_prev)
            t_prev = t
        return out


LIGHTNING_ACTIONS_PER_STEP = 18


# -- the variants --------------------------------------------------------------------------------------
BARE, SW, SW_ALL, SW_OFF, TORCH, LIGHTNING = ("bare", "stallwatch", "stallwatch, every step timed",
                                              "stallwatch, hooks off", "torch.profiler (minimal)",
                                              "Lightning SimpleProfiler")
VARIANTS = (BARE, SW, SW_ALL, SW_OFF, TORCH, LIGHTNING)


def minimal_torch_profiler():
    act = torch.profiler.ProfilerActivity
    return torch.profiler.profile(activities=[act.CPU], record_shapes=False, profile_memory=False,
                                  with_stack=False, with_flops=False, with_modules=False)


class Runner:
    def __init__(self, workload: Workload, steps: int, tmp: str) -> None:
        self.w = workload
        self.n = steps
        self.tmp = tmp
        self.times: dict[str, list[list[int]]] = {v: [] for v in VARIANTS}  # per round
        self.extra: dict[str, list[float]] = {"profile() enter ms": [], "profile() exit ms": [],
                                              "torch.profiler stop() ms": [], "events sent": [],
                                              "events dropped": [], "sender thread µs/step": []}

    def bare(self) -> None:
        self.w.steps(WARMUP_STEPS)
        self.times[BARE].append(self.w.steps(self.n))

    def torch_profiler(self) -> None:
        prof = minimal_torch_profiler()
        prof.start()
        self.w.steps(WARMUP_STEPS, prof.step)
        self.times[TORCH].append(self.w.steps(self.n, prof.step))
        t0 = time.perf_counter()
        prof.stop()
        self.extra["torch.profiler stop() ms"].append((time.perf_counter() - t0) * 1e3)

    def lightning(self) -> None:
        from lightning.pytorch.profilers import SimpleProfiler

        prof = SimpleProfiler()
        self.w.steps_lightning(WARMUP_STEPS, prof)
        self.times[LIGHTNING].append(self.w.steps_lightning(self.n, prof))

    def stallwatch(self, off_first: bool, every_step: bool = False) -> None:
        """The default session (steps sampled above 500 steps/s) with its hooks-off pass, or (`every_step`) a
        session that times every step (`sample_steps_above_per_s=0`): what each timed step costs."""
        import stallwatch.torch as swt
        from stallwatch.torch import session as sessions

        t0 = time.perf_counter()
        sampling = {"sample_steps_above_per_s": 0} if every_step else {}
        with swt.profile(out=f"{self.tmp}/run-{next(_RUN_IDS)}", gpu=False, **sampling):
            t1 = time.perf_counter()
            session = sessions.current()
            if session is None or session.hooks is None:
                raise RuntimeError("stallwatch.torch.profile() did not install its hooks")
            time.sleep(SETTLE_S)
            self.w.steps(WARMUP_STEPS)  # model discovery (first steps of a loop) done with hooks on
            sender_tid = next((t.native_id for t in threading.enumerate() if t.name == "stallwatch-events"), None)
            passes = (True,) if every_step else (False, True) if off_first else (True, False)
            for enabled in passes:
                session.hooks.enabled = enabled
                self.w.steps(WARMUP_STEPS)
                cpu0 = _thread_cpu_ns(sender_tid)
                self.times[SW_ALL if every_step else SW if enabled else SW_OFF].append(self.w.steps(self.n))
                if enabled and not every_step and sender_tid is not None:
                    self.extra["sender thread µs/step"].append((_thread_cpu_ns(sender_tid) - cpu0) / self.n / 1000)
            session.hooks.enabled = True
            sender = session.sender
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        self.extra["profile() enter ms"].append((t1 - t0) * 1e3)
        self.extra["profile() exit ms"].append((t3 - t2) * 1e3)
        if sender is not None:
            self.extra["events sent"].append(sender.sent)
            self.extra["events dropped"].append(sender.dropped)

    def round(self, r: int) -> None:
        order: list[Callable[[], None]] = [self.bare, lambda: self.stallwatch(off_first=r % 2 == 1),
                                           lambda: self.stallwatch(off_first=False, every_step=True),
                                           self.torch_profiler, self.lightning]
        k = r % len(order)
        for run in order[k:] + order[:k]:
            run()
            # Outside the timing: torch.profiler leaves its events in reference cycles; freeing them
            # (~0.2-0.5 s, by whichever later gen-0 collection finds them) would land in another
            # variant's steps. A job runs one of these, not all four in one process.
            gc.collect()


def _thread_cpu_ns(tid: int | None) -> int:
    """ns on CPU of one thread of this process (schedstat)."""
    if tid is None:
        return 0
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def report(title: str, runner: Runner) -> str:
    t = {v: [x / 1000 for rnd in runner.times[v] for x in rnd] for v in VARIANTS}
    round_med = {v: [statistics.median(rnd) / 1000 for rnd in runner.times[v]] for v in VARIANTS}
    base_med, base_mean = statistics.median(t[BARE]), statistics.mean(t[BARE])
    rows = []
    for v in VARIANTS:
        med, mean = statistics.median(t[v]), statistics.mean(t[v])
        diffs = [a - b for a, b in zip(round_med[v], round_med[BARE])]
        if v == BARE:
            rows.append([v, f"{len(t[v])}", f"{med:.1f}", f"{mean:.1f}", "-", "-", "-"])
            continue
        rows.append([v, f"{len(t[v])}", f"{med:.1f}", f"{mean:.1f}",
                     f"{med - base_med:+.1f} ({100 * (med - base_med) / base_med:+.2f} %)",
                     f"{mean - base_mean:+.1f} ({100 * (mean - base_mean) / base_mean:+.2f} %)",
                     f"{statistics.median(diffs):+.1f} [{_q(diffs, .25):+.1f}, {_q(diffs, .75):+.1f}]"])
    out = [title,
           table(["variant", "steps", "median µs", "mean µs", "Δ median vs bare", "Δ mean vs bare",
                  "Δ per round µs: median [p25, p75]"], rows)]
    ex = runner.extra
    stop = statistics.median(ex["torch.profiler stop() ms"])
    out.append(f"torch.profiler stop() (post-processing, outside the steps): median {stop:.1f} ms per "
               f"{runner.n + WARMUP_STEPS} steps = {1000 * stop / (runner.n + WARMUP_STEPS):.1f} µs/step amortized")
    out.append(f"stallwatch profile() enter (starts the sampler) median "
               f"{statistics.median(ex['profile() enter ms']):.0f} ms, exit (uninstall, last flush) median "
               f"{statistics.median(ex['profile() exit ms']):.0f} ms: once per job; "
               f"events sent per session median {statistics.median(ex['events sent']):.0f}, "
               f"dropped {sum(ex['events dropped']):.0f} in all; event-sender thread CPU during the timed "
               f"steps: median {statistics.median(ex['sender thread µs/step'] or [0]):.1f} µs/step")
    return "\n".join(out)


HOOK_METHODS = ("_batch_begin", "_discover_pre", "_discover_post", "_instance_pre", "_instance_post", "_optim_pre",
                "_optim_post")
TRACKER_METHODS = ("batch_end", "backward")


def breakdown(workload: Workload, steps: int, tmp: str) -> str:
    """In-situ time of each stallwatch hook body per step (micro step, real profile())."""
    import stallwatch.torch as swt
    from stallwatch.torch.hooks import TorchHooks

    acc: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    clock = time.perf_counter_ns

    def timed(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def wrapper(*args: object) -> object:
            t = clock()
            try:
                return fn(*args)
            finally:
                acc[name] += clock() - t
                calls[name] += 1
        return wrapper

    empty = timed("calibration", lambda: None)
    for _ in range(100_000):
        empty()
    self_ns = acc["calibration"] / calls["calibration"]
    original_install = TorchHooks.install

    def install(hooks: TorchHooks) -> None:  # wrap before install: the hooks register bound methods
        for name in HOOK_METHODS:
            if hasattr(hooks, name):
                setattr(hooks, name, timed(f"hooks.{name}", getattr(hooks, name)))
        for name in TRACKER_METHODS:
            if hasattr(hooks.tracker, name):
                setattr(hooks.tracker, name, timed(f"tracker.{name}", getattr(hooks.tracker, name)))
        original_install(hooks)

    TorchHooks.install = install  # type: ignore[method-assign]
    try:
        with swt.profile(out=f"{tmp}/run-{next(_RUN_IDS)}", gpu=False):
            time.sleep(SETTLE_S)
            workload.steps(WARMUP_STEPS)
            acc.clear()
            calls.clear()
            workload.steps(steps)
    finally:
        TorchHooks.install = original_install  # type: ignore[method-assign]
    rows, total = [], 0.0
    for name, ns in sorted(acc.items(), key=lambda kv: -kv[1]):
        per = (ns - self_ns * calls[name]) / steps / 1000
        total += per
        rows.append([name, f"{calls[name] / steps:.2f}", f"{per:.2f}"])
    rows.append(["all hook bodies", "", f"{total:.2f}"])
    return (f"Where stallwatch's per-step time goes (micro step, {steps} steps, in situ; timer cost "
            f"{self_ns / 1000:.2f} µs/call subtracted)\n" + table(["hook body", "calls/step", "µs/step"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps (under a minute)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 24, quick 6)")
    parser.add_argument("--steps", type=int, help="timed ~5 ms steps per variant per round (default 120, quick 60)")
    parser.add_argument("--micro-steps", type=int, help="timed micro steps per variant per round "
                        "(default 2000, quick 800)")
    parser.add_argument("--breakdown", action="store_true", help="also time each stallwatch hook in situ")
    args = parser.parse_args()
    rounds = args.rounds or (6 if args.quick else 24)
    steps = args.steps or (60 if args.quick else 120)
    micro_steps = args.micro_steps or (800 if args.quick else 2000)
    torch.set_num_threads(1)
    t_start = time.monotonic()

    import lightning.pytorch.profilers  # noqa: F401  (imported before timing)
    import stallwatch.torch  # noqa: F401

    with tempfile.TemporaryDirectory(prefix="sw-bench-") as tmp:
        prof = minimal_torch_profiler()  # the first profiler session of a process initialises Kineto
        prof.start()
        torch.ones(4).sum()
        prof.stop()
        results = []
        for title, workload, n in (
            ("~5 ms step", Workload(256, 512, 3, 128), steps),
            ("micro step: the per-step cost in isolation", Workload(32, 32, 1, 8), micro_steps),
        ):
            runner = Runner(workload, n, tmp)
            workload.steps(50)  # warm the allocator and caches once
            for r in range(rounds):
                runner.round(r)
            results.append(report(f"{title}: {workload.label}; {rounds} rounds x {n} timed steps per variant "
                                  f"(+{WARMUP_STEPS} warm-up)", runner))
        if args.breakdown:
            results.append(breakdown(workload, micro_steps * 2, tmp))
    print(f"Framework overhead per training step ({machine()}, torch {torch.__version__}, 1 intra-op thread)")
    print(f"Lightning SimpleProfiler wraps {LIGHTNING_ACTIONS_PER_STEP} actions per step\n")
    print("\n\n".join(results))
    print(f"\n({time.monotonic() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
