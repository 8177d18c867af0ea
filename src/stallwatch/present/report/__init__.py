"""The HTML report: every section of `sections.ORDER` built from one ReportContext, rendered into one
self-contained file and written atomically into the run (`report.html`) or wherever the caller says."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stallwatch.log import logger
from stallwatch.present.report.context import ReportContext
from stallwatch.present.report.model import NotApplicable, Section
from stallwatch.store import layout
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import Run, open_run
from stallwatch.timeutil import format_us

TITLE = "stallwatch profiling report"
RuleResults = Mapping[str, Mapping[str, Any]] | Sequence[Any]


def build_sections(ctx: ReportContext) -> list[Section]:
    """Every section module's sections, in ORDER. A module that raises becomes one section saying so (and
    one log line): a broken section never costs the rest of the report."""
    from stallwatch.present.report.sections import section_modules

    out: list[Section] = []
    for module in section_modules():
        name = module.__name__.rsplit(".", 1)[-1]
        try:
            out.extend(module.build(ctx))
        except Exception as exc:
            logger.warning("report: the %s section failed (%s: %s); the report goes on without it",
                           name, type(exc).__name__, exc)
            title = getattr(module, "TITLE", name.replace("_", " ").capitalize())
            out.append(Section(getattr(module, "SECTION_ID", name.replace("_", "-")), title, [NotApplicable(
                f"This section could not be built: {type(exc).__name__}: {exc}. The rest of the report is "
                "unaffected; please report this error with the run.")]))
    return out


def _rule_json(rule_results: RuleResults | None) -> dict[str, dict[str, Any]] | None:
    """Rule name -> result JSON, from either that mapping or a list of RuleResult (as `stallwatch run` has)."""
    if rule_results is None:
        return None
    if isinstance(rule_results, Mapping):
        return {str(k): dict(v) for k, v in rule_results.items()}
    return {r.name: r.to_json() for r in rule_results}


def subtitle(ctx: ReportContext) -> str:
    info = ctx.info
    nodes = ctx.nodes
    where = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    return (f"Run {info.get('run_id') or ctx.run.uri} · {where} · {format_us(info.get('start_us'))} → "
            f"{format_us(info.get('end_us'))}")


def render_report(run: Run | str, *, rule_results: RuleResults | None = None) -> str:
    """The report's HTML for `run` (a Run or its URI)."""
    from stallwatch.present.report.html import render

    run = open_run(run) if isinstance(run, str) else run
    ctx = ReportContext(run, rule_results=_rule_json(rule_results))
    return render(build_sections(ctx), title=TITLE, subtitle=subtitle(ctx))


def build_report(run: Run | str, out: str | os.PathLike[str] | None = None, *,
                 rule_results: RuleResults | None = None) -> str:
    """Build and write the report; returns where it went. Default: `report.html` at the run's root, through
    the run's location (local or S3); `out`: that local file. Written atomically either way: a reader sees
    the old report or the new one, never half of one."""
    run = open_run(run) if isinstance(run, str) else run
    data = render_report(run, rule_results=rule_results).encode("utf-8")
    if out is None:
        run.location.write_atomic(layout.REPORT_HTML, data)
        if run.location.remote:  # s3://bucket/prefix/run[?endpoint_override=…] -> …/run/report.html[?…]
            base, sep, query = run.location.uri.partition("?")
            return f"{base.rstrip('/')}/{layout.REPORT_HTML}{sep}{query}"
        return str(run.location.local_path(layout.REPORT_HTML))
    target = Path(out).expanduser().absolute()
    RunLocation(str(target.parent)).write_atomic(target.name, data)
    return str(target)
