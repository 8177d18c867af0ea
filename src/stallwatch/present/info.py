"""`stallwatch info`: what a run holds, as text."""

from __future__ import annotations

from collections import defaultdict

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.console import human, steps_table, table
from stallwatch.timeutil import format_duration, format_us


def render_info(analysis: RunAnalysis) -> str:
    """What a run holds, from its records and file footers (nothing is evaluated): nodes, ranks, time span,
    metrics, steps, profiling windows, and how the job ended."""
    run = analysis.run
    info = analysis.info
    fate = analysis.summary.fate
    overview = run.system_overview()
    ranks = run.ranks()
    files = run.files()
    lines = [
        f"run        {run.uri}",
        f"run id     {info.get('run_id', '-')}",
        f"command    {' '.join(info.get('command') or []) or '-'}",
        f"span       {format_us(info.get('start_us'))} → {format_us(info.get('end_us'))}"
        + (f" ({format_duration((info['end_us'] - info['start_us']) / 1e6)})"
           if info.get("start_us") and info.get("end_us") else ""),
        f"size       {human(sum(f.size for f in files), 'B')} in {len(files)} files",
        f"job        {fate.phrase()}",
    ]
    lines += [f"note       {n}" for n in analysis.notes]
    if analysis.recorded_custom_rules:
        lines.append(f"custom     recorded with custom rule(s) {', '.join(analysis.recorded_custom_rules)} (not run "
                     "from here: `stallwatch rules RUN --custom-rule SPEC` runs one you trust)")
    imported = info.get("imported")
    if isinstance(imported, dict):
        losses = imported.get("losses") or []
        lines.append(f"imported   from {imported.get('from', '?')}: {imported.get('source', '?')}"
                     + (f" ({len(losses)} loss(es) listed in run.json)" if losses else "")
                     + ("" if imported.get("complete", True) else " (INCOMPLETE: the import stopped)"))
    lines.append("")
    rows = []
    for name in run.nodes:
        node = analysis.node_record(name)
        ov = overview.get(name)
        rows.append([
            name, _or_dash(node.cpu_cores_logical),
            str(len(node.gpus)),
            str(ov.snapshots if ov else 0),
            format_us(ov.start_us) if ov else "-", format_us(ov.end_us) if ov else "-",
            human(ov.bytes, "B") if ov else "-",
            _or_dash(node.status) + (f" (attempt {node.fields['attempt']})" if node.fields.get("attempt") else ""),
            _or_dash(node.exit_code),
            ",".join(ranks.get(name, [])) or "-",
        ])
    lines.append(table(["node", "cores", "gpus", "snapshots", "first", "last", "stored", "status", "exit", "ranks"],
                       rows, "lrrrllrllr"))
    for name in run.nodes:
        keys = run.system_keys(name)
        bad = overview.get(name)
        if not keys and not (bad and bad.unreadable):
            continue
        devices: dict[str, list[str]] = defaultdict(list)
        for k in keys:
            devices[k.metric].append(k.device)
        lines += ["", f"metrics of {name}:"]
        for metric, devs in sorted(devices.items()):
            lines.append(f"  {metric:<20} {_compact(devs)}")
        if bad and bad.unreadable:
            lines.append(f"  ({bad.unreadable} unreadable file(s) skipped)")
    if ranks:
        steps = analysis.step_stats()
        if steps:
            lines += ["", "steps:", steps_table(steps, gpu=analysis.has_gpus)]
    windows = run.profiles()
    if windows:
        lines += ["", "profiling windows:"]
        for w in windows:
            first, last = w.get("first_step"), w.get("last_step")
            what = f"steps {first}-{last}" if first is not None else "time window"
            lines.append(f"  {w.get('node')}/{w.get('rank')}  {w.get('layer'):<9} {what:<14} {w.get('status', ''):<10}"
                         f" {w.get('path')}  ({', '.join(w.get('files') or [])})")
    return "\n".join(lines)


def _compact(devices: list[str]) -> str:
    """cpu0 … cpu15 instead of sixteen names."""
    plain = [d for d in devices if not d[-1:].isdigit()]
    numbered: dict[str, list[int]] = defaultdict(list)
    for d in devices:
        if d[-1:].isdigit():
            stem = d.rstrip("0123456789")
            numbered[stem].append(int(d[len(stem):]))
    parts = plain + [f"{stem}{min(n)}…{stem}{max(n)}" if len(n) > 2 and max(n) - min(n) + 1 == len(set(n))
                     else ", ".join(f"{stem}{i}" for i in sorted(n))  # a gap is shown, not hidden in a range
                     for stem, n in numbered.items()]
    return ", ".join(parts)


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)
