"""Detailed-profiling window: what a stallwatch `detailed_profiling` window costs the training thread,
side by side in one run with raw torch.profiler recording the same steps.

Target (issue): the window costs <= 1.05x what raw torch.profiler costs for the same steps.

Run: python benchmarks/detailed_window.py [--quick] [--rounds R] [--window-steps N]

Method
------
* The ~5 ms training step of benchmarks/framework_overhead.py (DataLoader over an in-memory TensorDataset,
  MLP 256-512-512-512-10, batch 128, SGD, `torch.set_num_threads(1)`); a run is K + N + M steps from a
  fresh DataLoader iterator (K = 5 before the window, N window steps, M = 10 after), each step timed as one
  loop iteration, `next(iterator)` included.
* Variants, in interleaved rounds (round r starts at variant r mod 3), one run each per round:
  - bare: the loop, nothing installed.
  - raw torch.profiler: at the top of step K, `torch.profiler.profile(activities=[CPU], record_shapes=True)`
    is made and started; at the top of step K+N, `stop()` then `export_chrome_trace(path)`. The same
    settings as stallwatch's window (no GPU here): an always-recording schedule and `prof.step()` at each
    step boundary inside, so the trace carries the same ProfilerStep#N step markers.
  - stallwatch: the same loop inside `stallwatch.torch.profile(out=tmp/run-i, gpu=False,
    detailed_profiling="K:N")` (a real sampler process, the always-on hooks, the window started and
    stopped by the hooks at step boundaries: started in step K's batch request, stopped and exported, to
    its staging directory, in step K+N's batch request, then announced to the sampler, which stores it on
    its own thread). Checked: the window ran, complete, on steps K..K+N-1.
  Both profiled variants therefore do all their profiler work inside iterations K..K+N (N+1 iterations).
* Window cost = sum of the times of iterations K..K+N. Overhead = window cost − the same round's bare
  window cost (the same iterations of the bare run), so the steps' own work cancels out.
  Ratio (the target) = stallwatch overhead / raw overhead, per round, median over rounds; also shown: the
  ratio of the median overheads, and the plain ratio of window wall times (stallwatch / raw), which
  includes the steps' own work and so is closer to 1.
* The breakdown columns split each variant's overhead vs bare: the start iteration (K), the mean of the
  N-1 iterations in between, the stop+export iteration (K+N), and the mean of the M steps after the window
  (for stallwatch, the sampler compresses and stores the trace then, in its own process).
* stallwatch's profile() enter/exit and the always-on layer are not part of the window: enter/exit happen
  outside the timed steps; the always-on hooks run in every step (a few µs, see framework_overhead.py)
  and are inside the stallwatch window cost, which is the honest side to put them on.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, table  # noqa: E402
from framework_overhead import Workload  # noqa: E402

BEFORE, AFTER = 5, 10  # steps before and after the window
SETTLE_S = 0.5  # after profile() starts the sampler process (its start-up uses ~25 % of a core for ~0.3 s)
BARE, RAW, SW = "bare", "raw torch.profiler", "stallwatch window"
VARIANTS = (BARE, RAW, SW)
_RUN_IDS = itertools.count(1)


def raw_profiler():
    record = torch.profiler.ProfilerAction.RECORD
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                  schedule=lambda _step: record)


class Runner:
    def __init__(self, workload: Workload, window: int, tmp: str) -> None:
        self.w = workload
        self.n = window
        self.total = BEFORE + window + AFTER
        self.tmp = tmp
        self.times: dict[str, list[list[int]]] = {v: [] for v in VARIANTS}
        self.trace_bytes: list[int] = []

    def bare(self) -> list[int]:
        return self.w.steps(self.total)

    def raw(self) -> list[int]:
        path = os.path.join(self.tmp, f"raw-{next(_RUN_IDS)}.json")
        state: dict[str, object] = {}

        def before(i: int) -> None:
            if i == BEFORE:
                prof = raw_profiler()
                prof.step_num = BEFORE
                prof.start()
                state["prof"] = prof
            elif BEFORE < i < BEFORE + self.n:
                state["prof"].step()  # type: ignore[attr-defined]
            elif i == BEFORE + self.n:
                prof = state.pop("prof")
                prof.stop()  # type: ignore[attr-defined]
                prof.export_chrome_trace(path)  # type: ignore[attr-defined]

        times = self.w.steps(self.total, before_step=before)
        self.trace_bytes.append(os.path.getsize(path))
        os.unlink(path)
        return times

    def stallwatch(self) -> list[int]:
        import stallwatch.torch as swt

        with swt.profile(out=f"{self.tmp}/run-{next(_RUN_IDS)}", gpu=False,
                         detailed_profiling=f"{BEFORE}:{self.n}") as prof:
            time.sleep(SETTLE_S)
            times = self.w.steps(self.total)
            windows = prof.windows
        ok = [w for w in windows if w["layer"] == "detailed" and w["status"] == "complete"
              and w["first_step"] == BEFORE and w["last_step"] == BEFORE + self.n - 1]
        if len(ok) != 1:
            raise RuntimeError(f"the stallwatch window did not run as configured: {windows}")
        return times

    def round(self, r: int, keep: bool = True) -> None:
        runs = [(BARE, self.bare), (RAW, self.raw), (SW, self.stallwatch)]
        k = r % len(runs)
        for name, run in runs[k:] + runs[:k]:
            times = run()
            if keep:
                self.times[name].append(times)


def report(runner: Runner) -> str:
    k, n = BEFORE, runner.n
    us = 1e-3

    def window(ts: list[int]) -> float:
        return sum(ts[k:k + n + 1]) * us

    parts = {
        "start step": lambda ts: ts[k] * us,
        "each step inside": lambda ts: statistics.mean(ts[k + 1:k + n]) * us,
        "stop+export step": lambda ts: ts[k + n] * us,
        "each step after": lambda ts: statistics.mean(ts[k + n + 1:]) * us,
    }
    bare = runner.times[BARE]
    over: dict[str, list[float]] = {}
    rows = []
    for v in VARIANTS:
        wins = [window(ts) for ts in runner.times[v]]
        over[v] = [window(ts) - window(b) for ts, b in zip(runner.times[v], bare)]
        row = [v, f"{statistics.median(wins) / 1000:.2f}",
               "-" if v == BARE else f"{statistics.median(over[v]) / 1000:+.2f}"]
        for fn in parts.values():
            if v == BARE:
                row.append(f"{statistics.median(fn(ts) for ts in bare) / 1000:.2f}")
            else:
                row.append(f"{statistics.median([fn(ts) - fn(b) for ts, b in zip(runner.times[v], bare)]) / 1000:+.2f}")
        rows.append(row)
    out = [table(["variant", "window ms", "overhead ms", *(f"{p} ms" for p in parts)], rows),
           "(window = iterations K..K+N; bare row: plain times; other rows: difference with the same round's bare "
           "run, median over rounds)"]
    ratios = [s / r for s, r in zip(over[SW], over[RAW]) if r > 0]
    walls = [window(s) / window(r) for s, r in zip(runner.times[SW], runner.times[RAW])]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    out.append(f"overhead ratio stallwatch / raw (target <= 1.05): median {statistics.median(ratios):.3f} "
               f"[p25 {q[0]:.3f}, p75 {q[2]:.3f}] over {len(ratios)} rounds; ratio of median overheads "
               f"{statistics.median(over[SW]) / statistics.median(over[RAW]):.3f}; "
               f"window wall-time ratio {statistics.median(walls):.3f}")
    out.append(f"raw trace.json: median {statistics.median(runner.trace_bytes) / 1e6:.2f} MB")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (under a minute)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 40, quick 8)")
    parser.add_argument("--window-steps", type=int, default=10, help="N, the steps profiled (default 10)")
    args = parser.parse_args()
    rounds = args.rounds or (8 if args.quick else 40)
    torch.set_num_threads(1)
    t_start = time.monotonic()
    import stallwatch.torch  # noqa: F401  (imported before timing)

    with tempfile.TemporaryDirectory(prefix="sw-bench-") as tmp:
        workload = Workload(256, 512, 3, 128)
        runner = Runner(workload, args.window_steps, tmp)
        workload.steps(50)
        runner.round(0, keep=False)  # the first profiler session of a process initialises Kineto
        for r in range(rounds):
            runner.round(r)
    print(f"Detailed-profiling window ({machine()}, torch {torch.__version__}, 1 intra-op thread): "
          f"{workload.label}, ~{statistics.median(x for ts in runner.times[BARE] for x in ts) / 1e6:.1f} ms a step; "
          f"window of N={args.window_steps} steps starting at step K={BEFORE}, {AFTER} steps after; "
          f"{rounds} rounds")
    print(report(runner))
    print(f"\n({time.monotonic() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
