"""The `stallwatch` command line: argument parsing and wiring of the stages, nothing more."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from stallwatch.config import LIVE_FIELDS, MAX_CONFIG_BYTES, ConfigError, ProfilerConfig, ProfilingRange
from stallwatch.log import configure_cli_logging, logger

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min)?\s*$")


def parse_interval_ms(text: str) -> int:
    """'500ms', '0.5s', '1m' or a bare number of milliseconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid interval {text!r}: use e.g. 100ms, 500ms, 1s, 5s, 1m")
    value, unit = float(m.group(1)), m.group(2) or "ms"
    factor = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000}[unit]
    return int(round(value * factor))


def _range_arg(name: str):
    def parse(text: str) -> ProfilingRange:
        try:
            return ProfilingRange.parse(name, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("profiling configuration (same fields as a JSON config file)")
    g.add_argument("--config", metavar="FILE", help="JSON file of config fields; flags given here override it")
    g.add_argument("--interval", dest="sample_interval_ms", type=parse_interval_ms, metavar="DURATION",
                   help="system sampling interval, 100ms … 60s (default 500ms; presets 100ms 200ms 500ms 1s 5s 1m)")
    g.add_argument("--out", metavar="DIR_OR_URI", help="the run directory itself (local path or s3://bucket/prefix/run)")
    g.add_argument("--runs-dir", metavar="DIR", help="where new runs go when --out is not given (default ./stallwatch-runs)")
    g.add_argument("--node", metavar="NAME", help="this machine's name in the run (default: hostname)")
    g.add_argument("--flush-interval", dest="flush_interval_s", type=float, metavar="SECONDS",
                   help="how often buffered samples are written (default 5)")
    g.add_argument("--max-storage-mb", type=float, metavar="MB", help="storage cap for this node's data (default 10240)")
    g.add_argument("--upload-timeout", dest="upload_timeout_s", type=float, metavar="SECONDS",
                   help="how long to keep uploading to S3 after the job ended (default 30)")
    g.add_argument("--rules-interval", dest="rules_interval_s", type=float, metavar="SECONDS",
                   help="evaluate the rules on new data this often while the job runs (default 10; 0: at the end only)")
    g.add_argument("--no-gpu", dest="gpu", action="store_false", default=None, help="do not sample GPUs")
    g.add_argument("--rule-action", dest="rule_actions", action="append", metavar="RULE=ACTION",
                   help="when RULE fires: log, stop_training, command:SHELL COMMAND or notify:URL (repeatable)")
    g.add_argument("--custom-rule", dest="custom_rules", action="append", metavar="MODULE:CLASS",
                   help="a rule of yours (module.path:Class or file.py:Class), evaluated like the built-ins")
    _add_live_flags(g)


def _add_live_flags(g: argparse._ArgumentGroup) -> None:
    """The fields a running job picks up from config.json (LIVE_FIELDS)."""
    g.add_argument("--detailed-profiling", type=_range_arg("detailed_profiling"), metavar="START:NUM|TIME/SECONDS",
                   help="torch.profiler for these steps or this time window")
    g.add_argument("--dataloader-profiling", type=_range_arg("dataloader_profiling"), metavar="START:NUM|TIME/SECONDS")
    g.add_argument("--python-profiling", type=_range_arg("python_profiling"), metavar="START:NUM|TIME/SECONDS")
    g.add_argument("--python-profiler", choices=["cprofile", "pyinstrument"])
    g.add_argument("--cprofile-timer", choices=["total", "cpu", "off_cpu"])
    g.add_argument("--stop-training", metavar="REASON",
                   help="stop training at the next step boundary (recorded with this reason)")


_CONFIG_FLAGS = ("sample_interval_ms", "out", "runs_dir", "node", "flush_interval_s", "max_storage_mb",
                 "upload_timeout_s", "gpu", "detailed_profiling", "dataloader_profiling", "python_profiling",
                 "python_profiler", "cprofile_timer", "rules_interval_s", "rule_actions", "custom_rules",
                 "stop_training")


def config_from_args(args: argparse.Namespace, *, strict_file: bool) -> ProfilerConfig:
    """Defaults, then the config file, then flags. A bad file is an error when `strict_file`, else a
    warning and the defaults (a job must not fail to start over its profiling config)."""
    base = ProfilerConfig()
    from_file = False
    if getattr(args, "config", None):
        try:
            base = ProfilerConfig.load(args.config)
            from_file = True
        except ConfigError as exc:
            if strict_file:
                raise
            logger.error("%s — running with the default configuration instead", exc)
    changes = {k: getattr(args, k) for k in _CONFIG_FLAGS if getattr(args, k, None) is not None}
    changes = {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}
    try:
        return check_rules(base.replace(**changes))
    except ConfigError as exc:
        if strict_file or not from_file:
            raise
        # raises when the flags alone are wrong: a usage error
        fallback = check_rules(ProfilerConfig().replace(**changes))
        # The file's values clash with the flags (e.g. its flush_interval_s is shorter than --interval).
        logger.error("%s (from %s together with the command-line flags) — running with the default "
                     "configuration and the flags instead", exc, args.config)
        return fallback


def check_rules(config: ProfilerConfig) -> ProfilerConfig:
    """The rules a config names must exist before a job starts: each custom rule loads (a bad one would
    otherwise stop every rule, built-ins included, for the whole run) and each rule action names a rule."""
    if not config.custom_rules and not config.rule_actions:
        return config
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.rules.registry import all_rules, load_custom

    for spec in config.custom_rules:
        try:
            load_custom([spec])
        except ParameterError as exc:
            raise ConfigError("custom_rules", spec, f"{exc}; give module.path:Class or path/to/file.py:Class "
                              "of a stallwatch.analyze.rules.Rule subclass") from None
    names = {cls.name.lower(): cls.name for cls in all_rules()}
    for text in config.rule_actions:
        rule = text.partition("=")[0].strip()
        if rule.lower() not in names:
            raise ConfigError("rule_actions", text, f"there is no rule named {rule!r}; rules: "
                              f"{', '.join(sorted(names.values()))}")
    return config


def cmd_run(args: argparse.Namespace) -> int:
    from stallwatch.collect.launcher import RunConflictError, launch

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("stallwatch run: give the command to profile after --, e.g. stallwatch run -- python train.py",
              file=sys.stderr)
        return 2
    try:
        config = config_from_args(args, strict_file=False)
    except ConfigError as exc:
        print(f"stallwatch run: {exc}", file=sys.stderr)
        return 2
    from stallwatch.collect.launcher import resolve_run_uri
    from stallwatch.live_rules import LiveRules

    config = config.replace(out=resolve_run_uri(config))  # known now: the rules follow the run while it goes on
    live = LiveRules(config)
    try:
        result = launch(command, config)
    except RunConflictError as exc:
        live.cancel()
        print(f"stallwatch run: {exc}", file=sys.stderr)
        return 2
    _print_run_summary(result, config)
    summary = live.finish(result.local_copy or result.run_uri)
    if summary:
        print(summary, file=sys.stderr)
    _write_run_report(result.local_copy or result.run_uri)
    return result.exit_code


def _write_run_report(uri: str) -> None:
    """The end of `stallwatch run`: report.html into the run (the rules' results just written there are read
    back, not evaluated again), its path the last line. Best effort: a failure is one line, never the exit code."""
    try:
        from stallwatch.present.report import build_report

        where = build_report(uri)
    except ImportError as exc:
        print(f"stallwatch: no report: {exc.name or exc} is not installed (pip install 'stallwatch[dashboard]'); "
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


def _print_run_summary(result: Any, config: ProfilerConfig) -> None:
    """Best effort: a summary that cannot be read (e.g. S3 down) is one line, never a failure. Reads
    only the summary's columns, wide, so a day-long run costs seconds and megabytes, not gigabytes."""
    from stallwatch.analyze.steps import PHASES, step_stats
    from stallwatch.analyze.usage import node_span_wide, usage_metrics, usage_stats_wide
    from stallwatch.present.console import run_summary
    from stallwatch.records import STEP
    from stallwatch.store.reader import open_run

    try:
        # Data that could not be uploaded is still complete in the local spool, itself a readable run.
        run = open_run(result.local_copy or result.run_uri)
        wide = run.system_wide(result.node, metrics=usage_metrics())
        span = node_span_wide(result.node, wide)
        steps = step_stats(run.framework(kinds=[STEP, *PHASES], nodes=[result.node]))
        windows = [w for w in run.profiles() if w.get("node") == result.node]
        text = run_summary(run_uri=result.run_uri, exit_code=result.exit_code, start_us=result.start_us,
                           end_us=result.end_us, spans=[span] if span else [],
                           stats=usage_stats_wide(result.node, wide), interval_ms=config.sample_interval_ms,
                           steps=steps, windows=windows)
    except Exception as exc:
        text = f"stallwatch: run {result.run_uri} (exit code {result.exit_code}); summary unavailable: {exc}"
    if result.local_copy:
        text += f"\n  not all of it reached {result.run_uri}: the rest is in {result.local_copy}"
    print(text, file=sys.stderr)


def _open(command: str, uri: str) -> Any:
    """The run at `uri`, or None after saying why it is not one."""
    from stallwatch.store.reader import RunNotFoundError, open_run

    try:
        return open_run(uri)
    except RunNotFoundError as exc:
        print(f"stallwatch {command}: {exc}", file=sys.stderr)
        return None
    except (OSError, ValueError) as exc:  # an unreachable endpoint, a location that is not one
        print(f"stallwatch {command}: cannot open {uri}: {_one_line(exc)}", file=sys.stderr)
        return None


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """An error as one short line (pyarrow's S3 errors run over several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


def cmd_info(args: argparse.Namespace) -> int:
    from stallwatch.present.info import render_info

    run = _open("info", args.run)
    if run is None:
        return 2
    print(render_info(run))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write the run's HTML report (report.html in the run, or -o FILE) and print where it went."""
    run = _open("report", args.run)
    if run is None:
        return 2
    try:
        from stallwatch.present.report import build_report

        where = build_report(run, args.output)
    except ImportError as exc:
        print(f"stallwatch report: {exc.name or exc} is not installed: pip install 'stallwatch[dashboard]'",
              file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"stallwatch report: the report could not be written ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    print(where)
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from stallwatch.store.location import RunLocation
    from stallwatch.store.transfer import copy_run

    run = _open("upload", args.source)
    if run is None:
        return 2
    try:
        result = copy_run(run.location, RunLocation(args.dest), delete_source=args.delete)
    except Exception as exc:
        print(f"stallwatch upload: could not copy to {args.dest}: {exc}. Nothing in {args.source} was removed; "
              "run the same command again once the destination is reachable.", file=sys.stderr)
        return 1
    print(f"copied {len(result.copied)} file(s) to {args.dest}, {len(result.skipped)} already there"
          + ("; removed the local copy" if args.delete else ""))
    return 0


# What a running job can pick up from config.json; the rest is fixed when the run starts.

def cmd_config(args: argparse.Namespace) -> int:
    """Show a run's config, or change its live fields: validated first, written atomically, or refused."""
    from stallwatch.store import layout

    run = _open("config", args.run)
    if run is None:
        return 2
    try:
        current = ProfilerConfig.from_json_bytes(run.location.read(layout.CONFIG_JSON, MAX_CONFIG_BYTES),
                                                 layout.CONFIG_JSON)
    except FileNotFoundError:
        current = ProfilerConfig()
    except (ConfigError, OSError) as exc:
        print(f"stallwatch config: the run's {layout.CONFIG_JSON} is invalid ({_one_line(exc)}); fix or replace it",
              file=sys.stderr)
        return 2
    changes = {k: getattr(args, k) for k in LIVE_FIELDS if getattr(args, k, None) is not None}
    clears = {name: None for name in (args.clear or [])}
    if not changes and not clears:
        print(current.to_json())
        return 0
    try:
        updated = current.replace(**changes, **clears)
    except ConfigError as exc:
        print(f"stallwatch config: {exc}. Nothing was changed.", file=sys.stderr)
        return 2
    run.location.write_atomic(layout.CONFIG_JSON, (updated.to_json() + "\n").encode())
    for name in sorted({**changes, **clears}):
        print(f"{name}: {_show(getattr(current, name))} -> {_show(getattr(updated, name))}")
    return 0


def _show(value: Any) -> str:
    return value.to_spec() if isinstance(value, ProfilingRange) else json.dumps(value)


def cmd_rules(args: argparse.Namespace) -> int:
    """Evaluate the rules on a run (finished or running), write rules/<RuleName>.json, print the summary."""
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.rules.feed import iter_run
    from stallwatch.analyze.rules.registry import all_rules, get_rule, load_custom
    from stallwatch.analyze.rules.live import follow
    from stallwatch.analyze.rules.runner import evaluate
    from stallwatch.present.rules_table import rules_table

    run = _open("rules", args.run)
    if run is None:
        return 2
    try:
        load_custom(_run_config(run).custom_rules)
        classes = [get_rule(n) for n in args.rule] if args.rule else all_rules()
        params: dict[str, dict[str, str]] = {}
        for text in args.param or []:
            name, sep, value = text.partition("=")
            rule, dot, key = name.partition(".")
            if not sep or not dot or not rule or not key:
                raise ParameterError(f"--param {text!r}: write RULE.parameter=value, e.g. CPUBottleneck.threshold=30")
            params.setdefault(get_rule(rule).name, {})[key] = value
        for cls in classes:
            cls(**params.get(cls.name, {}))  # a bad parameter is refused before anything is read
        if args.follow:
            results = follow(run, classes, params, every_s=args.every,
                             on_results=lambda res, final: _follow_line(run, res, final))
        else:
            results = evaluate(classes, iter_run(run, classes), params)
    except ParameterError as exc:
        print(f"stallwatch rules: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    _write_rules(run, results)
    print(rules_table(results))
    return 0


def _run_config(run: Any) -> ProfilerConfig:
    """The run's configuration (defaults when its config.json is missing or unreadable)."""
    from stallwatch.store import layout

    try:
        return ProfilerConfig.from_dict(json.loads(run.location.read(layout.CONFIG_JSON)))
    except Exception:
        return ProfilerConfig()


def _write_rules(run: Any, results: list) -> None:
    from stallwatch.analyze.rules.runner import write_results

    try:
        write_results(run.location, results)
    except OSError as exc:
        print(f"stallwatch rules: cannot write the results into {run.uri} ({exc})", file=sys.stderr)


def _follow_line(run: Any, results: list, final: bool) -> None:
    """One line per live evaluation: which rules fire so far; the files are rewritten each time."""
    from datetime import datetime, timezone

    _write_rules(run, results)
    fired = ", ".join(f"{r.name} ({r.triggered})" for r in sorted(results, key=lambda r: -r.triggered) if r.triggered)
    print(f"{datetime.now(timezone.utc):%H:%M:%S} {'final' if final else 'so far'}: "
          f"{fired or 'no rule triggered'}", flush=True)


def cmd_timeline(args: argparse.Namespace) -> int:
    """Write the run as one Chrome-trace / Perfetto file (nodes, ranks and counters on one time axis)."""
    from pathlib import Path

    from stallwatch.present.trace_export import export_timeline, resolve_time, run_origin_us
    from stallwatch.store import layout

    run = _open("timeline", args.run)
    if run is None:
        return 2
    # The run id is data from the run: only a plain name goes into a path (never "../x" or "/etc/x").
    name = layout.plain_name(run.info.get("run_id")) or layout.plain_name(Path(args.run.rstrip("/")).name) or "run"
    out = args.output or f"{name}-timeline.json.gz"
    try:
        origin = run_origin_us(run)
        start = None if args.start is None else resolve_time(args.start, origin, "--start")
        end = None if args.end is None else resolve_time(args.end, origin, "--end")
        if start is not None and end is not None and start >= end:
            raise ValueError(f"--start {args.start} is not before --end {args.end}")
    except ValueError as exc:
        print(f"stallwatch timeline: {exc}", file=sys.stderr)
        return 2
    try:
        s = export_timeline(run, out, start_us=start, end_us=end, max_points=args.max_points,
                            max_events=args.max_events, all_metrics=args.all_metrics, profiler=args.profiler)
    except OSError as exc:
        print(f"stallwatch timeline: cannot write {out} ({exc})", file=sys.stderr)
        return 1
    logger.info("timeline: %d framework events, %d counter tracks (%d points), %d torch.profiler window(s)",
                s.framework_events, s.counter_series, s.counter_points, s.profiler_windows)
    print(s.path)
    return 0


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, at least {minimum}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stallwatch", description="Profile deep-learning training jobs.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="run a command under the profiler",
                       usage="stallwatch run [options] -- CMD [ARGS...]")
    _add_config_flags(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("rules", help="evaluate the profiler rules on a run and write rules/<RuleName>.json")
    p.add_argument("run", help="run directory or s3:// URI")
    p.add_argument("--rule", action="append", metavar="NAME", help="only this rule (repeatable)")
    p.add_argument("--param", action="append", metavar="RULE.KEY=VALUE",
                   help="a rule parameter, e.g. StepOutlier.stddev=2 (repeatable)")
    p.add_argument("--follow", action="store_true",
                   help="evaluate a running job's new data as it arrives, until the job ends")
    p.add_argument("--every", type=float, default=10.0, metavar="SECONDS", help="with --follow (default 10)")
    p.set_defaults(func=cmd_rules)
    p = sub.add_parser("info", help="what a run holds: nodes, ranks, time span, metrics, size")
    p.add_argument("run", help="run directory or s3:// URI")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("report", help="write the run's interactive HTML report (one file that opens offline)")
    p.add_argument("run", help="run directory or s3:// URI")
    p.add_argument("-o", "--output", metavar="FILE", help="write it here instead of report.html in the run")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("config", help="show a run's profiling config, or change it while the job runs")
    p.add_argument("run", help="run directory or s3:// URI")
    _add_live_flags(p.add_argument_group("live profiling configuration"))
    p.add_argument("--clear", action="append", choices=["detailed_profiling", "dataloader_profiling",
                                                        "python_profiling"], help="turn a profiling window off")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("upload", help="copy a run (e.g. what a dead S3 endpoint left in the local spool) to its destination")
    p.add_argument("source", help="the local run directory (the spool directory named in the log)")
    p.add_argument("dest", help="the run's URI, e.g. s3://bucket/prefix/run-7")
    p.add_argument("--delete", action="store_true", help="remove the local copy once everything is copied")
    p.set_defaults(func=cmd_upload)
    p = sub.add_parser("timeline", help="export the run as one Chrome-trace / Perfetto file (open in ui.perfetto.dev)")
    p.add_argument("run", help="run directory or s3:// URI")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write it (default ./<run-id>-timeline.json.gz; gzipped when it ends in .gz)")
    p.add_argument("--start", metavar="TIME", help="only from here: seconds from the run's start or an ISO time (UTC)")
    p.add_argument("--end", metavar="TIME", help="only up to here: seconds from the run's start or an ISO time (UTC)")
    p.add_argument("--max-points", type=_at_least(2), default=10_000, metavar="N",
                   help="points per counter track at most; min/max per time bucket keeps spikes (default 10000)")
    p.add_argument("--max-events", type=_at_least(0), default=1_000_000, metavar="N",
                   help="framework events at most; later ones are left out, said in a log line "
                        "(default 1000000; 0: no cap)")
    p.add_argument("--all-metrics", action="store_true",
                   help="every stored series (per core, GPU power and clocks, the job's processes…), "
                        "not only the main ones")
    p.add_argument("--no-profiler", dest="profiler", action="store_false",
                   help="leave out the torch.profiler events of detailed-profiling windows")
    p.set_defaults(func=cmd_timeline)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    configure_cli_logging()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except OSError as exc:  # a store that stopped answering halfway (S3 down, a disk gone): one line, no traceback
        print(f"stallwatch {args.cmd}: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
