"""Keras 3 integration: what stallwatch's ProfilerCallback adds to each step of `model.fit`, per backend, side by
side in one run with the bare fit and with a do-nothing batch callback.

Run: python benchmarks/keras_overhead.py [--rounds R] [--steps N] [--backends torch,jax]

Method
------
* A real fit: NumPy arrays in memory, an MLP 64-256-256-1, batch 32, Adam, MSE, `verbose=0`, on the CPU. Each
  variant runs in a fresh process (the backend is fixed when keras is imported): one warm-up fit (100 steps:
  compilation, the model build), then one timed fit of N steps, wall time around `fit` / N = time per step.
* Variants, interleaved in R rounds (round r starts at variant r mod V):
  - bare: no callback. Keras may then dispatch batch-end callbacks asynchronously (JAX: no sync per step).
  - no-op callback: a Callback overriding on_train_batch_begin/end with `pass`: what any batch callback costs
    (Keras then calls them synchronously, as with the progress bar on, verbose=1).
  - stallwatch: `stallwatch.keras.ProfilerCallback(out=…)`, recording a run of its own (sampler process,
    event sender, the step tracker, fetch timing, the optimizer wrapper on torch, the PyTorch hooks inside
    steps on torch). Its sampler starts with the warm-up fit; the timed fit is the steady state.
* Per variant and backend: the median over rounds of µs per step; overhead = variant − bare, and the paired
  per-round difference stallwatch − no-op callback (stallwatch's own cost beyond being a batch callback).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, table  # noqa: E402

VARIANTS = ("bare", "no-op callback", "stallwatch")

JOB = r'''
import json, sys, time
import numpy as np
import keras
variant, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
class Noop(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None): pass
    def on_train_batch_end(self, batch, logs=None): pass
callbacks = []
if variant == "no-op callback":
    callbacks = [Noop()]
elif variant == "stallwatch":
    from stallwatch.keras import ProfilerCallback
    callbacks = [ProfilerCallback(out=out)]
rng = np.random.default_rng(0)
x = rng.random((steps * 32, 64), dtype=np.float32); y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(x[:100 * 32], y[:100 * 32], batch_size=32, epochs=1, verbose=0, callbacks=callbacks)
t0 = time.perf_counter()
model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks)
print(json.dumps({"us_per_step": (time.perf_counter() - t0) / steps * 1e6}))
'''


def run(backend: str, variant: str, steps: int, tmp: str, i: int) -> float:
    env = dict(os.environ, KERAS_BACKEND=backend, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("STALLWATCH_EVENTS", "STALLWATCH_RUN", "STALLWATCH_CONFIG", "STALLWATCH_STAGING"):
        env.pop(name, None)
    p = subprocess.run([sys.executable, "-c", JOB, variant, str(steps), os.path.join(tmp, f"run-{backend}-{i}")],
                       capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{backend}/{variant} failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["us_per_step"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--backends", default="torch,jax")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for r in range(args.rounds):
                order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
                for v in order:
                    times[v].append(run(backend, v, args.steps, tmp, len(rows) * 100 + r * 10 + VARIANTS.index(v)))
            bare = statistics.median(times["bare"])
            paired = [s - n for s, n in zip(times["stallwatch"], times["no-op callback"])]
            for v in VARIANTS:
                med = statistics.median(times[v])
                extra = "" if v != "stallwatch" else f"{statistics.median(paired):+.0f}"
                rows.append([backend, v, f"{med:.0f}", f"{med - bare:+.0f}", f"{100 * (med - bare) / bare:+.1f} %",
                             extra])
    print(f"Keras fit, {args.steps} steps of batch 32 (MLP 64-256-256-1), {args.rounds} rounds; {machine()}")
    print(table(["backend", "variant", "µs/step", "vs bare µs", "vs bare", "stallwatch − no-op µs"], rows))


if __name__ == "__main__":
    main()
