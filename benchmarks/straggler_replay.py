"""Straggler's result on a long run: the step × rank grid read again from the run (its replay), which is what the
caller does alone after the nodes were evaluated, on Dask too. Straggler is fed the run node by node and merged (in
this process), its state pickled before the final chunk; then each source tree (this one, and `--baseline`: the
`src` folder of another checkout) loads that state in a fresh process, gets the final chunk and makes its result,
rounds interleaved. Prints seconds per round and a digest of the result (they must be equal).

Run: python benchmarks/straggler_replay.py --run RUN_DIR [--baseline OTHER_CHECKOUT/src] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def save(run_dir: str, state: str) -> None:
    """Straggler over the run, node by node, pickled just before its final chunk."""
    from stallwatch.analyze.engine import LocalEngine
    try:
        from stallwatch.analyze.judge import by_node
    except ImportError:  # a baseline tree from before analyze/judge/
        from stallwatch.analyze.rules import by_node  # type: ignore[no-redef]
    from stallwatch.analyze.rules.straggler import Straggler
    from stallwatch.store.reader import open_run

    feed = by_node.feed

    def saving(rules, chunk, failed):  # type: ignore[no-untyped-def]
        if chunk.final:
            Path(state).write_bytes(pickle.dumps(rules[0]))
        feed(rules, chunk, failed)

    by_node.feed = saving  # type: ignore[assignment]
    by_node.evaluate_by_node(open_run(run_dir), [Straggler], engine=LocalEngine())


def result(run_dir: str, state: str) -> dict:
    """The saved state fed the final chunk; seconds of `result()` and its digest."""
    try:
        from stallwatch.analyze.judge.feed import RunReplay, empty_chunk
    except ImportError:  # a baseline tree from before analyze/judge/
        from stallwatch.analyze.rules.feed import RunReplay, empty_chunk  # type: ignore[no-redef]
    from stallwatch.store.reader import open_run

    run = open_run(run_dir).pinned()
    info = dict(run.info)
    info["operators"] = run.operators()
    rule = pickle.loads(Path(state).read_bytes())
    rule.update(empty_chunk(run, info, RunReplay(run, info)))
    t = time.perf_counter()
    out = rule.result().to_json()
    return {"s": time.perf_counter() - t,
            "digest": hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:12]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--baseline", help="the src folder of another checkout, measured beside this one")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # what state: one measurement, in this process
    a = ap.parse_args()
    if a.child:
        print(json.dumps(result(a.run, a.child[1]) if a.child[0] == "result" else save(a.run, a.child[1])))
        return
    trees = {"this": str(SRC)} | ({"baseline": a.baseline} if a.baseline else {})
    with tempfile.TemporaryDirectory() as tmp:
        state = f"{tmp}/straggler.pkl"

        def child(src: str, what: str) -> dict:
            env = {**os.environ, "PYTHONPATH": src}
            proc = subprocess.run([sys.executable, __file__, "--run", a.run, "--child", what, state], env=env,
                                  capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            return json.loads(proc.stdout.strip().splitlines()[-1]) or {}

        t = time.perf_counter()
        child(str(SRC), "save")
        print(f"Straggler fed node by node: {time.perf_counter() - t:.1f} s", flush=True)
        times: dict[str, list[float]] = {name: [] for name in trees}
        digests = set()
        for _ in range(a.rounds):
            for name, src in trees.items():
                row = child(src, "result")
                times[name].append(row["s"])
                digests.add(row["digest"])
                print(f"  {name}: result() {row['s']:.1f} s ({row['digest']})", flush=True)
    for name, values in times.items():
        print(f"{name}: median {statistics.median(values):.1f} s of {', '.join(f'{v:.1f}' for v in values)}")
    print(f"identical results: {'yes' if len(digests) == 1 else 'NO'}")
    if len(digests) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
