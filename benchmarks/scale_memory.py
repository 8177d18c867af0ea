"""Fleet scale: peak memory and wall time of `stallwatch rules`, `report`, `timeline` and `info` on generated runs
of N nodes × 8 GPUs × H hours at 500 ms with framework events at 10 steps/s per rank (8 ranks a node), so one
sees what grows with the number of nodes (issue 15's target: flat from 8 to 64 nodes, ≤ 1.5 GB).

The runs come from report_gen.py (the store's own writers and file names; 16 cores, 8 GPUs, 8 ranks a node, an
odd node, slow steps, hourly checkpoints), with `step_s` = 1 / steps-per-s, and are kept in --data DIR. Each
command runs in a fresh Python process (`python -m stallwatch …`); its peak memory is that process's VmHWM (peak
RSS: interpreter, numpy, pyarrow and all), read by the process itself as it exits. `rules` runs first and stores
its results, so `report` reads them as it does after `stallwatch run`.

Run: python benchmarks/scale_memory.py --data DIR [--nodes 1,8,16] [--hours 1] [--steps-per-s 10]
                                      [--commands rules,report,timeline,info] [--engine local|dask|dask=ADDR]
                                      [--jobs N]
Prints a Markdown table: nodes, hours, events, stored MB, and per command its seconds and peak MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import report_gen  # noqa: E402

COMMANDS = ("rules", "report", "timeline", "info")
# Runs `stallwatch` in this process and writes its exit code and VmHWM to the file named by argv[1].
_WRAPPER = """
import sys
out, argv = sys.argv[1], sys.argv[2:]
from stallwatch.cli import main
try:
    rc = main(argv)
except SystemExit as exc:
    rc = exc.code if isinstance(exc.code, int) else 1
hwm = 0
with open("/proc/self/status") as fh:
    for line in fh:
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
with open(out, "w") as fh:
    fh.write(f"{rc} {hwm}")
sys.exit(rc)
"""


def command_args(command: str, run: Path, scratch: Path, engine: str | None) -> list[str]:
    """The command line of `command` on `run` (outputs in `scratch`), with `--engine` where it takes one."""
    args = {"rules": ["rules", str(run)], "report": ["report", str(run), "-o", str(scratch / "report.html")],
            "timeline": ["timeline", str(run), "-o", str(scratch / "timeline.json.gz")],
            "info": ["info", str(run)]}[command]
    if engine and command in ("rules", "report", "timeline"):
        args += ["--engine", engine]
    return ["-q", *args]


def measure(argv: list[str]) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of `stallwatch argv` in a fresh process; raises if it fails."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _WRAPPER, out.name, *argv], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - t0
        text = Path(out.name).read_text().split()
    if proc.returncode != 0 or len(text) != 2:
        raise RuntimeError(f"stallwatch {' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, int(text[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="where the generated runs are kept (and reused)")
    ap.add_argument("--nodes", default="1,8,16", help="comma-separated node counts")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--steps-per-s", type=float, default=10.0)
    ap.add_argument("--interval-ms", type=int, default=500)
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--engine", default=None, help="--engine for rules, report and timeline (default: local)")
    ap.add_argument("--jobs", type=int, default=1, help="nodes generated at once (processes), for runs not yet made")
    a = ap.parse_args()
    commands = [c for c in a.commands.split(",") if c]
    unknown = set(commands) - set(COMMANDS)
    if unknown:
        ap.error(f"unknown command(s) {', '.join(sorted(unknown))}; commands: {', '.join(COMMANDS)}")
    print(f"machine: {_common.machine()}; engine: {a.engine or 'local'}", flush=True)
    rows = []
    for nodes in [int(n) for n in a.nodes.split(",")]:
        shape = report_gen.Shape(nodes=nodes, hours=a.hours, interval_ms=a.interval_ms, step_s=1.0 / a.steps_per_s)
        run, summary = report_gen.dataset(a.data / f"n{nodes}-h{a.hours:g}-s{a.steps_per_s:g}", shape, a.jobs)
        print(f"{nodes} nodes × {a.hours:g} h: {summary['events']:,} events, {summary['bytes'] / 1e6:,.0f} MB "
              f"(generated in {summary['generate_s']} s)", flush=True)
        row = [str(nodes), f"{a.hours:g}", f"{summary['events'] / 1e6:.1f} M", f"{summary['bytes'] / 1e6:,.0f}"]
        with tempfile.TemporaryDirectory(prefix="scale-") as scratch:
            for command in commands:
                seconds, peak = measure(command_args(command, run, Path(scratch), a.engine))
                print(f"  {command}: {seconds:.1f} s, {peak / 1e6:,.0f} MB", flush=True)
                row += [f"{seconds:.1f}", f"{peak / 1e6:,.0f}"]
        rows.append(row)
    headers = ["nodes", "hours", "events", "stored MB"]
    for command in commands:
        headers += [f"{command} s", f"{command} MB"]
    print()
    print(_common.table(headers, rows))
    print(json.dumps({"engine": a.engine or "local", "rows": rows, "headers": headers}))


if __name__ == "__main__":
    os.environ.setdefault("STALLWATCH_LOG_LEVEL", "WARNING")
    main()
