"""The end of `stallwatch run`: the rules' last evaluation, then ONE `RunAnalysis` of the run that the summary,
the findings (findings.json) and the report all read, so the run is read and its rules evaluated once. Each
step is best effort: a failure is one line on stderr, never the job's exit code."""

from __future__ import annotations

import sys
from typing import Any

from stallwatch.cli.install_hint import install_command
from stallwatch.collect import report_timing
from stallwatch.config import ProfilerConfig
from stallwatch.log import logger


class _Analysis:
    """The run's one analysis, opened on first use (a run that cannot be opened, e.g. S3 down, is tried again
    by the next step and said by each)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._analysis: Any = None

    def get(self) -> Any:
        if self._analysis is None:
            from stallwatch.analyze.analysis import RunAnalysis

            self._analysis = RunAnalysis(self.uri)
        return self._analysis


def finish(result: Any, config: ProfilerConfig, live: Any, *, report: str, as_json: bool) -> None:
    """After the job: the summary (text, at once; or `--json`), the rules' table and what to fix first, then the
    report as `report` (a `report_timing` mode) says. Data that could not be uploaded is still complete in the
    local spool, itself a readable run: everything reads that copy then."""
    uri = result.local_copy or result.run_uri
    analysis = _Analysis(uri)
    if as_json:
        results = _finish_rules(live, uri)
        if results is _UNFINISHED:
            return  # said; evaluating them here would hold the job's allocation on the slow store again
        _print_json_summary(analysis, result, results)
    else:
        _print_run_summary(analysis, result, config)  # before the rules' last evaluation: it needs none of them
        results = _finish_rules(live, uri)
        if results is _UNFINISHED:
            return
        _print_cost(analysis, config, results)
        _print_rules(analysis, results)
        _print_findings(analysis, results)
    if report == report_timing.WAIT:
        _write_run_report(analysis, results)
    elif report == report_timing.BACKGROUND:
        _start_report_builder(uri)


_UNFINISHED: Any = object()  # the rules' last pass overran --upload-timeout on a slow store: nothing more is read


def _finish_rules(live: Any, uri: str) -> Any:
    """The rules' last evaluation after the job; None when they could not be evaluated (said in one line);
    `_UNFINISHED` when their pass over a slow store overran the upload timeout (said, with what to run later:
    the findings and the report would read the store again)."""
    from stallwatch.analyze.judge.during_run import RulesNotFinished

    try:
        return live.finish(uri)
    except RulesNotFinished as exc:
        print(f"stallwatch: {exc}; `stallwatch summary {uri}` and `stallwatch report {uri}` give the findings and "
              "the report", file=sys.stderr)
        return _UNFINISHED
    except Exception as exc:
        print(f"stallwatch: the rules could not be evaluated ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def _with_results(analysis: _Analysis, results: list | None) -> Any:
    """The analysis, given the rules' results just evaluated (None: it reads or evaluates them itself)."""
    a = analysis.get()
    a.use_rule_results(results)
    return a


def _print_rules(analysis: _Analysis, results: list | None) -> None:
    """The rules' table, as the analysis tells them (a job that ended before its first step: the rules say so,
    not "was it run under stallwatch run?")."""
    if results is not None:
        from stallwatch.present.rules_table import rules_table

        try:
            results = _with_results(analysis, results).rule_results
        except Exception:  # the run cannot be opened now: the results as evaluated
            pass
        print("\n" + rules_table(results), file=sys.stderr)


def _print_json_summary(analysis: _Analysis, result: Any, results: list | None) -> None:
    """`stallwatch run --json`: the summary document on stderr (stdout is the job's), findings.json written."""
    from stallwatch.present import json_out

    try:
        a = _with_results(analysis, results)
        document = json_out.summary_json(a, result.node)
        a.write_findings()
    except Exception as exc:
        document = {"run": result.run_uri, "exit": {"code": result.exit_code, "signal": result.exit_signal},
                    "error": f"summary unavailable: {type(exc).__name__}: {exc}"}
    print(json_out.dumps(document), file=sys.stderr)


def _print_run_summary(analysis: _Analysis, result: Any, config: ProfilerConfig) -> None:
    """This node's usage and steps at once (no rule is needed). Best effort: a summary that cannot be read
    (e.g. S3 down) is one line, never a failure. Reads only this node's summary columns, so a day-long run
    costs seconds and megabytes, not gigabytes."""
    from stallwatch.analyze.usage import NodeSpan
    from stallwatch.present.console import run_summary

    try:
        a = analysis.get()
        frame = a.system(result.node, ())
        spans = [NodeSpan(result.node, len(frame), int(frame.timestamps.min()), int(frame.timestamps.max()))] \
            if len(frame) else []
        windows = [w for w in a.profiles() if w.get("node") == result.node]
        text = run_summary(run_uri=result.run_uri, exit_code=result.exit_code, start_us=result.start_us,
                           end_us=result.end_us, spans=spans, stats=a.usage(result.node),
                           sample_interval_ms=config.sample_interval_ms, steps=a.step_stats(result.node),
                           windows=windows, exit_signal=result.exit_signal, interrupted=result.interrupted,
                           notes=a.notes, jobs=[j for j in [a.job_usage(result.node)] if j is not None],
                           interval_changes={n: r.interval_changes for n, r in a.node_records.items()})
    except Exception as exc:
        text = f"stallwatch: run {result.run_uri} (exit code {result.exit_code}); summary unavailable: {exc}"
    if result.local_copy:
        text += f"\n  not all of it reached {result.run_uri}: the rest is in {result.local_copy}"
    print(text, file=sys.stderr)


def _print_cost(analysis: _Analysis, config: ProfilerConfig, results: list | None) -> None:
    """With a price: the run's cost, under the summary (it weighs the findings, so after the rules)."""
    if config.price_per_hour is None:
        return
    from stallwatch.present.summary import cost_text

    try:
        cost = _with_results(analysis, results).cost
        if cost is not None:
            print(cost_text(cost), file=sys.stderr)
    except Exception as exc:
        logger.debug("no cost (%s: %s)", type(exc).__name__, exc)


def _print_findings(analysis: _Analysis, results: list | None) -> None:
    """What to fix first, after the rules' summary, and findings.json into the run. Best effort."""
    from stallwatch.present.console import findings_text

    try:
        a = _with_results(analysis, results)
        text = findings_text(a.findings)
        a.write_findings()
    except Exception as exc:
        print(f"stallwatch: the findings could not be made ({type(exc).__name__}: {exc})", file=sys.stderr)
        return
    print("\n" + text, file=sys.stderr)


def _write_run_report(analysis: _Analysis, results: list | None) -> None:
    """report.html into the run, from the same analysis (the rules' results just evaluated are used, not
    evaluated again), its path the last line. Best effort: a failure is one line, never the exit code."""
    uri = analysis.uri
    try:
        from stallwatch.present.report import build_report

        where = build_report(_with_results(analysis, results))
    except ImportError as exc:
        print(f"stallwatch: no report: {_package(exc)} is not installed ({install_command('dashboard')}); "
              f"`stallwatch report {uri}` writes it once it is", file=sys.stderr)
        return
    except Exception as exc:
        print(f"stallwatch: the report could not be written ({type(exc).__name__}: {exc}); "
              f"`stallwatch report {uri}` tries again", file=sys.stderr)
        return
    except KeyboardInterrupt:  # the job is over and its exit code stands; the report can be made later
        print(f"stallwatch: report skipped (interrupted); `stallwatch report {uri}` writes it", file=sys.stderr)
        return
    print(f"stallwatch: report {where}", file=sys.stderr)


def _start_report_builder(uri: str) -> None:
    """`--report background` (and `auto` at a terminal): `stallwatch report RUN` in its own session, detached
    from this terminal and its pipes (a pipeline reading this command's output ends when the job's status is
    returned). The rules' results are in the run already: it renders them, it does not evaluate them again.
    Until it is done, report.html is a page that reloads itself, so the printed path opens at once."""
    import subprocess

    from stallwatch.present.report.placeholder import placeholder_html
    from stallwatch.store import layout, run_files
    from stallwatch.store.location import RunLocation

    location = RunLocation(uri)
    try:  # before the builder starts: its report must never be replaced by this page
        run_files.write_report(location, placeholder_html(uri).encode("utf-8"))
        placeholder = True
    except Exception as exc:
        logger.debug("no placeholder report (%s: %s)", type(exc).__name__, exc)
        placeholder = False
    try:
        subprocess.Popen([sys.executable, "-m", "stallwatch", "report", "--quiet", uri], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        if placeholder:
            try:
                location.delete(layout.REPORT_HTML)
            except Exception:
                pass
        print(f"stallwatch: the report could not be started ({exc.strerror or exc}); `stallwatch report {uri}` "
              "writes it", file=sys.stderr)
        return
    print(f"stallwatch: report {run_files.report_uri(location)} (being written in the background; it opens now and "
          "shows the report once it is there)", file=sys.stderr)


def _package(exc: ImportError) -> str:
    """The package to install: `bokeh`, not the submodule whose import failed first (`bokeh.models`)."""
    return (exc.name or str(exc)).split(".")[0]
