"""The HTML report over a generated 8-node × 24 h run at 500 ms with 8 GPUs per node, side by side with what
reading that run costs.

Target (issue 5): the report builds in <= 60 s on this 2-core machine and the file is <= 10 MB.

The run comes from report_gen.py (16 cores, 8 GPUs and 8 ranks of ~0.5 s steps per node: 1.4 M snapshots and
~55 M framework events), written with the store's own writers once and reused from --data. Its rules are
evaluated once and stored in it, as `stallwatch run` leaves a run before it writes the report.

Each measurement runs in a fresh process; peak memory is that process's VmHWM (peak RSS):
  report        build_report(run): the report as `stallwatch run` and `stallwatch report` build it (stored rules)
  baseline      the naive read of what the report summarises: every node's snapshots (all columns) and every
                framework event (Run.system_wide + Run.framework), nothing computed
  rules         (--with-rules) evaluating the eleven rules over the run, which `stallwatch report` does first on
                a run without stored results
The report process also times each section and the final rendering, and the file's size is split into
the inline JavaScript (BokehJS and draw.js), the charts' specs (JSON) and the rest (tables, text).

Run: python benchmarks/report_cost.py [--data DIR] [--repeat 1] [--with-rules]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, peak_rss, table  # noqa: E402
from report_gen import Shape, dataset  # noqa: E402

TARGET_S = 60.0
TARGET_BYTES = 10_000_000
MB = 1e6


def with_stored_rules(run_dir: Path) -> float:
    """Evaluate the rules once and store them in the run (as `stallwatch run` does); seconds it took, or 0
    when they are there already."""
    from stallwatch.analyze.judge.feed import iter_run
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.analyze.judge.runner import evaluate, write_results
    from stallwatch.store.reader import open_run

    if all((run_dir / "rules" / f"{cls.name}.json").exists() for cls in builtin_rules()):
        return 0.0
    t0 = time.perf_counter()
    run = open_run(str(run_dir))
    write_results(run.location, evaluate(builtin_rules(), iter_run(run, builtin_rules())))
    return time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------
# Measured parts (each in a fresh process: `--child MODE`)


def child_report(run_dir: str, out: str) -> dict[str, Any]:
    from stallwatch.present.report import TITLE, subtitle
    from stallwatch.analyze.analysis import RunAnalysis as ReportContext
    from stallwatch.present.report.html import render
    from stallwatch.present.report.sections import section_modules
    from stallwatch.store.location import RunLocation
    from stallwatch.store.reader import open_run

    t0 = time.perf_counter()
    ctx = ReportContext(open_run(run_dir))
    sections, per_section = [], []
    for module in section_modules():  # what build_report does, each section timed
        a = time.perf_counter()
        sections += module.build(ctx)
        per_section.append([module.__name__.rsplit(".", 1)[-1], time.perf_counter() - a])
    a = time.perf_counter()
    html = render(sections, title=TITLE, subtitle=subtitle(ctx)).encode("utf-8")
    RunLocation(str(Path(out).parent)).write_atomic(Path(out).name, html)
    per_section.append(["render + write", time.perf_counter() - a])
    total = time.perf_counter() - t0
    blocks = re.findall(r"<script[^>]*>.*?</script>", html.decode("utf-8"), flags=re.S)
    library = sum(len(b) for b in blocks if "const Draw" in b)  # BokehJS + draw.js, one script
    charts = sum(len(b) for b in blocks if 'id="stallwatch-charts"' in b[:200])  # the specs, as JSON
    return {"total_s": total, "bytes": len(html), "bokeh_js_bytes": library, "chart_bytes": charts,
            "sections": per_section, "rss_peak": peak_rss()}


def child_baseline(run_dir: str) -> dict[str, Any]:
    from stallwatch.store.reader import open_run

    t0 = time.perf_counter()
    run = open_run(run_dir)
    snapshots = sum(run.system_wide(node).num_rows for node in run.nodes)
    events = run.framework().num_rows
    return {"total_s": time.perf_counter() - t0, "snapshots": snapshots, "events": events, "rss_peak": peak_rss()}


def child_rules(run_dir: str) -> dict[str, Any]:
    from stallwatch.analyze.judge.feed import iter_run
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.analyze.judge.runner import evaluate
    from stallwatch.store.reader import open_run

    t0 = time.perf_counter()
    results = evaluate(builtin_rules(), iter_run(open_run(run_dir), builtin_rules()))
    return {"total_s": time.perf_counter() - t0, "rss_peak": peak_rss(),
            "fired": {r.name: r.triggered for r in results}}


def spawn(data: Path, mode: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--data", str(data), "--child", mode], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-4000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "stallwatch-report-cost"),
                   help="where the generated run is kept (reused when present)")
    p.add_argument("--repeat", type=int, default=1, help="fresh processes per measurement (median time)")
    p.add_argument("--with-rules", action="store_true", help="also time evaluating the rules over the run")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    data = Path(args.data)
    if args.child:
        run_dir = str(data / "run")
        out = {"report": lambda: child_report(run_dir, str(data / "report.html")),
               "baseline": lambda: child_baseline(run_dir), "rules": lambda: child_rules(run_dir)}[args.child]()
        print("RESULT " + json.dumps(out))
        return

    run_dir, summary = dataset(data, Shape())
    if run_dir != data / "run":
        raise SystemExit(f"expected the run in {data / 'run'}, got {run_dir}")
    stored_s = with_stored_rules(run_dir)
    print(machine())
    print(f"run: {summary}")
    if stored_s:
        print(f"rules evaluated and stored once: {stored_s:.1f} s")

    def median(mode: str) -> dict[str, Any]:
        runs = sorted((spawn(data, mode) for _ in range(max(1, args.repeat))), key=lambda r: r["total_s"])
        return runs[len(runs) // 2]

    report, baseline = median("report"), median("baseline")
    rows = [["report (stored rules, as `stallwatch run` builds it)", f"{report['total_s']:.1f} s",
             f"{report['rss_peak'] / MB:,.0f} MB", f"{report['bytes'] / MB:.2f} MB",
             "yes" if report["total_s"] <= TARGET_S and report["bytes"] <= TARGET_BYTES else "NO"],
            ["baseline: read every snapshot and event", f"{baseline['total_s']:.1f} s",
             f"{baseline['rss_peak'] / MB:,.0f} MB", "", ""]]
    if args.with_rules:
        rules = median("rules")
        rows.append(["rules evaluated first (a run without stored results)", f"{rules['total_s']:.1f} s",
                     f"{rules['rss_peak'] / MB:,.0f} MB", "", ""])
    print(table(["what", "time", "peak memory", "file", f"<= {TARGET_S:.0f} s, <= 10 MB?"], rows))
    print()
    print(table(["section", "time"], [[name, f"{s:.2f} s"] for name, s in report["sections"]]))
    print(f"\nfile: {report['bytes'] / MB:.2f} MB: BokehJS and draw.js {report['bokeh_js_bytes'] / MB:.2f} MB, "
          f"the charts' specs {report['chart_bytes'] / MB:.2f} MB, the rest (text, tables, styles) "
          f"{(report['bytes'] - report['bokeh_js_bytes'] - report['chart_bytes']) / MB:.2f} MB; baseline read "
          f"{baseline['snapshots']:,} snapshots and {baseline['events']:,} events")


if __name__ == "__main__":
    main()
