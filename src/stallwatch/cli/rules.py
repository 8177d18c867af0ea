"""`stallwatch rules RUN`: evaluate the rules on a run (finished or running) and write rules/<RuleName>.json."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stallwatch.cli.opening import open_engine_or_say, open_with_rules


def cmd_rules(args: argparse.Namespace) -> int:
    """Evaluate the rules on a run (finished or running), write rules/<RuleName>.json, print the summary. The
    rules take the parameters the run was recorded with (`run --param`), each overridden by this `--param`.
    Custom rules run only when named here (`--custom-rule`): never because the run's config names them."""
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.judge.by_node import evaluate_run
    from stallwatch.analyze.judge.feed import count_slices
    from stallwatch.analyze.judge.live import follow
    from stallwatch.analyze.judge.params import run_rule_params
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.present.progress import Progress
    from stallwatch.present.rules_table import rules_table

    opened = open_with_rules("rules", args)
    if opened is None:
        return 2
    run, custom, params = opened
    _say_recorded_custom_rules(run, custom)
    try:
        known = builtin_rules() + [c for c in custom if c not in builtin_rules()]
        classes = [_rule_named(n, known) for n in args.rule] if args.rule else known
        params = run_rule_params(run.location, known, params)  # the run's own `--param`s, unless given here
        if args.follow:
            if args.engine != "local":
                raise ParameterError("--follow evaluates new data as it arrives, in this process: "
                                     "leave out --engine")
            results = follow(run, classes, params, every_s=args.every,
                             on_results=lambda res, final: _follow_line(run, res, final, args.json))
        else:
            engine = open_engine_or_say("rules", args.engine)
            if engine is None:
                return 2
            try:
                slices = count_slices(run)
                with Progress("rules", unit="slices") as bar:
                    results = evaluate_run(run, classes, params, engine=engine,
                                           progress=lambda done: bar.update(done, slices))
            finally:
                engine.close()
    except ParameterError as exc:
        print(f"stallwatch rules: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    _write_rules(run, results)
    if not args.follow:
        _derived_files_follow(run, results, whole=not args.rule)
    if args.json:
        from stallwatch.present import json_out

        print(json_out.dumps(json_out.rules_json(run.uri, results)))
    else:
        print(rules_table(results))
    return 0


def _rule_named(name: str, known: list) -> Any:
    from stallwatch.analyze.rules.base import ParameterError

    for cls in known:
        if cls.name.lower() == name.lower():
            return cls
    raise ParameterError(f"no rule named {name!r}; rules: {', '.join(c.name for c in known)}")


def _say_recorded_custom_rules(run: Any, loaded: list) -> None:
    """A run recorded with custom rules says so, and how to run them: they are never loaded from the run."""
    from stallwatch.store import run_files

    named = {c.name for c in loaded}
    recorded = [s for s in run_files.config_or_default(run.location).custom_rules
                if s.rpartition(":")[2] not in named]
    if recorded:
        print(f"stallwatch: this run was recorded with custom rule(s) {', '.join(recorded)}; they are not run "
              "from the run's configuration. To run one you trust: stallwatch rules RUN --custom-rule "
              f"{recorded[0]}", file=sys.stderr)


def _write_rules(run: Any, results: list) -> None:
    from stallwatch.analyze.judge.runner import write_results

    try:
        write_results(run.location, results)
    except OSError as exc:
        print(f"stallwatch rules: cannot write the results into {run.uri} ({exc})", file=sys.stderr)


def _derived_files_follow(run: Any, results: list, *, whole: bool) -> None:
    """What the rules' results feed follows them: findings.json is rewritten from them (`summary`, `ls` and the
    dashboard read it); a report is said to show the earlier evaluation. A subset of the rules (`--rule`)
    rewrites nothing else and says so: one run never tells two stories without a word."""
    from stallwatch.store import layout, run_files

    try:
        had_report = run.location.exists(layout.REPORT_HTML)
        had_findings = run.location.exists(run_files.FINDINGS_JSON)
    except OSError:
        return
    stale = []
    if whole:
        try:
            from stallwatch.analyze.analysis import RunAnalysis

            RunAnalysis(run, rule_results=results).write_findings()
        except Exception as exc:
            print(f"stallwatch rules: findings.json could not be rewritten ({type(exc).__name__}: {exc})",
                  file=sys.stderr)
            stale.append(run_files.FINDINGS_JSON) if had_findings else None
    elif had_findings:
        stale.append(run_files.FINDINGS_JSON)
    if had_report:
        stale.append(layout.REPORT_HTML)
    if stale:
        print(f"stallwatch rules: {' and '.join(stale)} still show the earlier evaluation: `stallwatch report "
              f"{run.uri}` rewrites them from these results", file=sys.stderr)


def _follow_line(run: Any, results: list, final: bool, to_stderr: bool = False) -> None:
    """One line per live evaluation: which rules fire so far; the files are rewritten each time. With --json
    the lines go to stderr, so stdout holds the one document at the end."""
    from datetime import datetime, timezone

    _write_rules(run, results)
    fired = ", ".join(f"{r.name} ({r.triggered})" for r in sorted(results, key=lambda r: -r.triggered) if r.triggered)
    print(f"{datetime.now(timezone.utc):%H:%M:%S} {'final' if final else 'so far'}: "
          f"{fired or 'no rule triggered'}", flush=True, file=sys.stderr if to_stderr else sys.stdout)
