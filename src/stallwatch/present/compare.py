"""`stallwatch compare BASELINE RUN` as text: the verdict on step time first, then the tables side by side."""

from __future__ import annotations

from stallwatch import catalogue
from stallwatch.analyze.compare import QUANTILES, Comparison, Pair
from stallwatch.analyze.price import RunCost, money
from stallwatch.present.console import table


def comparison_text(c: Comparison, base_cost: RunCost | None = None, run_cost: RunCost | None = None) -> str:
    lines = [f"baseline   {c.baseline_uri}", f"run        {c.run_uri}"]
    slower = c.slower_pct()
    if slower is not None:
        lines.append(f"verdict    the median TRAIN step is {abs(slower):.1f} % {'slower' if slower > 0 else 'faster'}"
                     " than the baseline's")
    lines += [f"note       {n}" for n in c.notes]
    rows = []
    for mode, (base, run) in c.step_times.items():
        for label, pick in [("steps", lambda t: t.steps), ("mean ms", lambda t: t.mean_ms)] + [
                (f"p{round(q * 100)} ms", lambda t, q=q: t.at(q)) for q in QUANTILES]:
            rows.append(_row(f"{mode} {label}", Pair(label, None if base is None else pick(base),
                                                     None if run is None else pick(run))))
    out = ["\n".join(lines), table(["step time", "baseline", "run", "change"], rows)]
    for mode, phases in c.phases.items():
        out.append(table([f"{mode} phase (% of step)", "baseline", "run", "change"],
                         [_row(catalogue.label(p.name), p) for p in phases]))
    if c.utilization:
        out.append(table(["utilization (mean %)", "baseline", "run", "change"], [_row(p.name, p) for p in c.utilization]))
    found = [f"appeared   {t}" for t in c.findings_appeared] + [f"went away  {t}" for t in c.findings_gone] + \
        [f"in both    {t}" for t in c.findings_kept]
    out.append("findings\n" + ("\n".join(f"  {f}" for f in found) if found else "  none in either run"))
    if c.operators:
        out.append(table(["operator (µs per profiled step)", "baseline", "run", "change"],
                         [_row(p.name, p) for p in c.operators]))
    if base_cost is not None and run_cost is not None:
        delta = run_cost.total - base_cost.total
        out.append(f"cost       baseline {money(base_cost.total)}, run {money(run_cost.total)} "
                   f"({'+' if delta >= 0 else '-'}{money(abs(delta))})")
    return "\n\n".join(out)


def _row(label: str, pair: Pair) -> list[str]:
    change = pair.change_pct
    return [label, _num(pair.baseline), _num(pair.run), "–" if change is None else f"{change:+.1f} %"]


def _num(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"
