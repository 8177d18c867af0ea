"""What the HTML report costs after the job, on the README's demo run, the old way (Bokeh models built and
serialised in Python) and the new way (chart specs carried as JSON, drawn by draw.js + BokehJS in the browser)
side by side in one run.

Target (issue 37): the report costs <= 0.5 s after the job.

The old way is the package as it was before draw.js (`--old-rev`, by default the parent of the commit that added
src/stallwatch/present/static/draw.js), checked out with `git worktree` into a temporary folder and run from
there; the new way is this checkout. Both build the same run's report, each in fresh processes:
  import      importing the report's code (`stallwatch run` does it during the job, in an idle-priority thread)
  build       build_report(run) once imported: what is left for after the job
  cold        both, in a process that imported nothing before
and `stallwatch run` of the demo with `--report off` and with the default (the report written before it returns,
as outside a terminal): its wall time, and the time from the job's exit (stamped by the job's shell) to
`stallwatch run`'s return, which holds the rules' last pass, the summary and, by default, the report. On a
shared 2-core machine the job's own duration varies by seconds, so the after-the-job time is the number to read.

Run: python benchmarks/report_after_job.py [--repeat 3] [--old-rev REV]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, table

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.5
DEMO = [sys.executable, "examples/train.py"]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import stallwatch.present.report as report
from stallwatch.present.report.sections import section_modules
section_modules()
t1 = time.perf_counter()
where = report.build_report(sys.argv[1], sys.argv[2])
t2 = time.perf_counter()
print("RESULT " + json.dumps({"import_s": t1 - t0, "build_s": t2 - t1, "bokeh_python": "bokeh" in sys.modules}))
"""


def old_rev() -> str:
    """The commit before draw.js: the parent of the commit that added it."""
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "src/stallwatch/present/static/draw.js"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    if not added:
        raise SystemExit("draw.js is not in this checkout's history: pass --old-rev")
    return f"{added[-1]}^"


def env_for(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def build_once(src: Path, run: Path, out: Path) -> dict[str, float]:
    p = subprocess.run([sys.executable, "-c", CHILD, str(run), str(out)], env=env_for(src), capture_output=True,
                       text=True, cwd=ROOT, check=False)
    if p.returncode != 0:
        raise SystemExit(f"report build failed ({src}):\n{p.stderr[-3000:]}")
    return json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])


def run_wall(src: Path, out: Path, report: bool) -> tuple[float, float]:
    """(wall, after the job) of `stallwatch run` of the demo, in seconds."""
    extra = [] if report else ["--report", "off"]
    mark = out.with_name(out.name + ".job-ended")
    job = ["sh", "-c", f'{" ".join(DEMO)} && date +%s.%N > "{mark}"']
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "stallwatch.cli", "run", "--out", str(out), *extra, "--", *job],
                       env=env_for(src), capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL, check=False)
    wall, ended = time.perf_counter() - t0, time.time()
    if p.returncode != 0:
        raise SystemExit(f"stallwatch run failed ({src}):\n{p.stderr[-3000:]}")
    if report and not (out / "report.html").exists():
        raise SystemExit(f"no report written by the default run ({src}):\n{p.stderr[-2000:]}")
    return wall, ended - float(mark.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per measurement (median)")
    ap.add_argument("--old-rev", default=None, help="the old way's commit (default: the parent of draw.js)")
    args = ap.parse_args()
    rev = args.old_rev or old_rev()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="report-after-job-") as tmp:
        work = Path(tmp)
        old_tree = work / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old_tree), rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            ways = {"old (Bokeh models in Python)": old_tree / "src", "new (specs + draw.js)": ROOT / "src"}
            run = work / "demo"
            run_wall(ROOT / "src", run, report=False)  # the demo run both ways build their report of
            rows, walls = [], []
            for name, src in ways.items():
                builds = [build_once(src, run, work / f"report-{i}.html") for i in range(args.repeat)]
                imp = statistics.median(b["import_s"] for b in builds)
                build = statistics.median(b["build_s"] for b in builds)
                size = (work / "report-0.html").stat().st_size
                rows.append([name, f"{imp:.2f} s", f"{build:.2f} s", f"{imp + build:.2f} s", f"{size / 1e6:.2f} MB",
                             "yes" if builds[0]["bokeh_python"] else "no",
                             "yes" if build <= TARGET_S else "NO"])
                off = [run_wall(src, work / f"off-{name[:3]}-{i}", report=False) for i in range(args.repeat)]
                on = [run_wall(src, work / f"on-{name[:3]}-{i}", report=True) for i in range(args.repeat)]
                med = [statistics.median(x[k] for x in runs) for runs in (off, on) for k in (0, 1)]
                walls.append([name, f"{med[0]:.2f} s", f"{med[2]:.2f} s", f"{med[1]:.2f} s", f"{med[3]:.2f} s",
                              f"{med[3] - med[1]:+.2f} s"])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=ROOT, capture_output=True,
                           check=False)
    print(f"old way: {rev}; demo: {' '.join(DEMO[1:])}; median of {args.repeat} fresh processes each\n")
    print(table(["report of the demo run", "import", "build (after the job)", "cold (both)", "file",
                 "bokeh Python loaded", f"build <= {TARGET_S} s?"], rows))
    print()
    print(table(["`stallwatch run` of the demo", "wall, --report off", "wall, default", "after the job, off",
                 "after the job, default", "the report's cost after the job"], walls))


if __name__ == "__main__":
    main()
