"""The accuracy tests as the machine is and beside CPU hogs: a verdict that changes when another process shares
the cores is a wrong verdict (docs/accuracy.md). Runs the planted-scenario tests twice in one go — first with
nothing added, then with `--hogs` busy loops pinned on each core the tests may use — and prints one table:
each test's outcome and time in both, with the load each saw.

    python benchmarks/verdicts_beside_hogs.py [--hogs 1] [TEST_PATH ...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, table

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TESTS = ["tests/analyze/test_accuracy.py", "tests/analyze/test_loaders_accuracy.py"]
HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", re.MULTILINE)
DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call)\s+(\S+::\S+)", re.MULTILINE)  # runs are made in setup


def _start_hogs(per_core: int) -> list[subprocess.Popen]:
    cores = sorted(os.sched_getaffinity(0))
    return [subprocess.Popen([sys.executable, "-c", HOG, str(c)]) for c in cores for _ in range(per_core)]


def _stop(hogs: list[subprocess.Popen]) -> None:
    for p in hogs:
        p.kill()
    for p in hogs:
        p.wait()


def _pytest(tests: list[str], hogs: int) -> tuple[dict[str, str], dict[str, float], float, float]:
    """Each test's outcome and call time, the wall time and the mean 1-minute load seen across the run."""
    started = _start_hogs(hogs) if hogs else []
    loads: list[float] = []
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen([sys.executable, "-m", "pytest", "-rA", "-v", "-p", "no:cacheprovider",
                                     "--durations=0", *tests], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                loads.append(os.getloadavg()[0])
                time.sleep(5)
            out.seek(0)
            text = out.read()
    finally:
        _stop(started)
    outcomes = {name: what for name, what in OUTCOME.findall(text)}
    durations: dict[str, float] = {}
    for seconds, name in DURATION.findall(text):
        durations[name] = durations.get(name, 0.0) + float(seconds)
    return outcomes, durations, time.monotonic() - t0, sum(loads) / max(len(loads), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hogs", type=int, default=1, help="busy loops pinned on each core in the second pass")
    parser.add_argument("tests", nargs="*", default=DEFAULT_TESTS)
    args = parser.parse_args()
    plain = _pytest(args.tests, 0)
    busy = _pytest(args.tests, args.hogs)
    names = sorted(n for n in set(plain[0]) | set(busy[0])  # a scenario a test does not apply to: left out
                   if not plain[0].get(n) == busy[0].get(n) == "SKIPPED")
    rows = [[n.split("::", 1)[1][:70], plain[0].get(n, "-"), f"{plain[1].get(n, 0):.1f}",
             busy[0].get(n, "-"), f"{busy[1].get(n, 0):.1f}"] for n in names]
    print(f"{machine()}; {args.hogs} hog(s) per core in the second pass")
    print(table(["test", "as is", "s", "beside hogs", "s"], rows))
    print(f"wall: {plain[2]:.0f} s at load {plain[3]:.1f} | {busy[2]:.0f} s at load {busy[3]:.1f}")
    same = all(plain[0].get(n) == busy[0].get(n) for n in names)
    print("verdicts: the same in both passes" if same else "verdicts: DIFFER between the passes")
    return 0 if same and all(v in ("PASSED", "SKIPPED") for v in (*plain[0].values(), *busy[0].values())) else 1


if __name__ == "__main__":
    sys.exit(main())
