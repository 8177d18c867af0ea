"""The HTML report: every section of `sections.ORDER` built from one RunAnalysis, rendered into one
self-contained file and written atomically into the run (`report.html`) or wherever the caller says."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from stallwatch import __version__
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult
from stallwatch.log import logger
from stallwatch.present.report.model import NotApplicable, Section
from stallwatch.store import run_files
from stallwatch.store.reader import Run
from stallwatch.timeutil import format_us

TITLE = "stallwatch profiling report"


def build_sections(analysis: RunAnalysis, *, progress: Callable[[int, int], None] | None = None) -> list[Section]:
    """Every section module's sections, in ORDER. A module that raises becomes one section saying so (and
    one log line): a broken section never costs the rest of the report. `progress(done, total)` after each."""
    from stallwatch.present.report.sections import section_modules

    out: list[Section] = []
    modules = section_modules()
    for done, module in enumerate(modules, 1):
        if progress is not None:
            progress(done - 1, len(modules))
        name = module.__name__.rsplit(".", 1)[-1]
        try:
            out.extend(module.build(analysis))
        except Exception as exc:
            logger.warning("report: the %s section failed (%s: %s); the report goes on without it",
                           name, type(exc).__name__, exc)
            title = getattr(module, "TITLE", name.replace("_", " ").capitalize())
            out.append(Section(getattr(module, "SECTION_ID", name.replace("_", "-")), title, [NotApplicable(
                f"This section could not be built: {type(exc).__name__}: {exc}. The rest of the report is "
                "unaffected; please report this error with the run.")]))
    return out


def subtitle(analysis: RunAnalysis) -> str:
    s = analysis.summary
    where = f"{len(s.nodes)} node{'s' if len(s.nodes) != 1 else ''}"
    return (f"Run {s.run_id} · {where} · {format_us(s.start_us)} → {format_us(s.last_us)} · "
            f"stallwatch {__version__}")


def render_report(run: Run | str | RunAnalysis, *, rule_results: Sequence[RuleResult] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> str:
    """The report's HTML for `run` (an analysis, a Run or its URI)."""
    from stallwatch.present.report.html import render

    analysis = run if isinstance(run, RunAnalysis) else RunAnalysis(run, rule_results=rule_results)
    return render(build_sections(analysis, progress=progress), title=TITLE, subtitle=subtitle(analysis))


def build_report(run: Run | str | RunAnalysis, out: str | os.PathLike[str] | None = None, *,
                 rule_results: Sequence[RuleResult] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> str:
    """Build and write the report; returns where it went. Default: `report.html` at the run's root, through
    the run's location (local or S3); `out`: that local file. Written atomically either way: a reader sees
    the old report or the new one, never half of one."""
    analysis = run if isinstance(run, RunAnalysis) else RunAnalysis(run, rule_results=rule_results)
    data = render_report(analysis, progress=progress).encode("utf-8")
    if out is None:
        return run_files.write_report(analysis.run.location, data)
    return run_files.write_file_atomic(out, data)
