"""The `stallwatch` command line: argument parsing and wiring of the stages, nothing more."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from stallwatch.collect import report_timing
from stallwatch.config import LIVE_FIELDS, ConfigError, ProfilerConfig, ProfilingRange
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
    g.add_argument("--price-per-hour", dest="price_per_hour", type=float, metavar="AMOUNT",
                   help="what one node costs per hour (any currency): the summary and report show the run's cost")
    g.add_argument("--escalate", choices=["on", "off"], default=None,
                   help="when a live rule fires, capture a few seconds of operators (and data-loader or Python "
                        "timing) on its own, within a budget (default on)")
    g.add_argument("--escalate-every", dest="escalate_every_s", type=float, metavar="SECONDS",
                   help="at most one automatic capture per rule this often (default 600)")
    g.add_argument("--escalate-budget", dest="escalate_budget_pct", type=float, metavar="PCT",
                   help="automatic captures take at most this %% of the job's time so far (default 2)")
    g.add_argument("--sample-steps-above", dest="sample_steps_above_per_s", type=float, metavar="STEPS_PER_S",
                   help="above this many steps a second per rank, time steps 10 ms of every second and count the "
                        "others, so that µs-long steps cost the job little (default 500; 0: time every step)")
    g.add_argument("--upload-timeout", dest="upload_timeout_s", type=float, metavar="SECONDS",
                   help="how long to keep uploading to S3 after the job ended (default 30)")
    g.add_argument("--rules-interval", dest="rules_interval_s", type=float, metavar="SECONDS",
                   help="evaluate the rules on new data this often while the job runs (default 10; 0: at the end only)")
    g.add_argument("--no-gpu", dest="gpu", action="store_false", default=None, help="do not sample GPUs")
    g.add_argument("--rule-action", dest="rule_actions", action="append", metavar="RULE=ACTION",
                   help="when RULE fires: log, stop_training, command:SHELL COMMAND or notify:URL (repeatable)")
    g.add_argument("--custom-rule", dest="custom_rules", action="append", metavar="MODULE:CLASS",
                   help="a rule of yours (module.path:Class or file.py:Class), evaluated like the built-ins")
    g.add_argument("--param", dest="rule_params", action="append", metavar="RULE.KEY=VALUE",
                   help="a rule parameter for this run, live and at the end, e.g. LowGPUUtilization.patience=0 "
                        "(repeatable)")
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
                 "rule_params", "stop_training", "price_per_hour", "escalate", "escalate_every_s",
                 "escalate_budget_pct", "sample_steps_above_per_s")


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
    if "escalate" in changes:
        changes["escalate"] = changes["escalate"] == "on"
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
    otherwise stop every rule, built-ins included, for the whole run), each rule action names a rule and each
    rule parameter is one of its rule's, of the right type."""
    if not config.custom_rules and not config.rule_actions and not config.rule_params:
        return config
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.rules.registry import all_rules, load_custom, parse_params

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
    try:
        parse_params(config.rule_params, all_rules())
    except ParameterError as exc:
        raise ConfigError("rule_params", list(config.rule_params), str(exc).removeprefix("--param ")) from None
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
    from stallwatch.analyze.rules.during_run import LiveRules
    from stallwatch.collect.launcher import resolve_run_uri

    config = config.replace(out=resolve_run_uri(config))  # known now: the rules follow the run while it goes on
    live = LiveRules(config)
    timing = report_timing.choose(getattr(args, "report", report_timing.AUTO), interactive=_at_a_terminal())
    logger.debug("the report after the job: %s (%s)", timing.mode, timing.why)
    if timing.mode == report_timing.WAIT:
        from stallwatch.present.report.warm import warm_in_background

        warm_in_background()
    dashboard = _start_dashboard(config.out, args.dashboard) if getattr(args, "dashboard", None) is not None else None
    try:
        result = launch(command, config)
    except RunConflictError as exc:
        live.cancel()
        _stop_dashboard(dashboard)
        print(f"stallwatch run: {exc}", file=sys.stderr)
        return 2
    except BaseException:
        _stop_dashboard(dashboard)
        raise
    uri = result.local_copy or result.run_uri
    if getattr(args, "json", False):
        results = _finish_rules(live, uri, quiet=True)
        _print_json_summary(uri, result, results)
    else:
        _print_run_summary(result, config)
        results = _finish_rules(live, uri)
        _print_findings(uri, results)
    if timing.mode == report_timing.WAIT:
        _write_run_report(uri, results)
    elif timing.mode == report_timing.BACKGROUND:
        _start_report_builder(uri)
    _stop_dashboard(dashboard)
    return result.exit_code


def _start_dashboard(uri: str, port: int) -> Any:
    """`stallwatch run --dashboard`: the dashboard in a process of its own (its own session: the terminal's
    Ctrl-C goes to the job, not to it), so nothing it does can reach the job; it prints its URL itself. A
    dashboard that cannot start says why in one line and the job runs anyway."""
    import subprocess

    try:
        return subprocess.Popen([sys.executable, "-m", "stallwatch", "dashboard", uri, "--port", str(port),
                                 "--wait", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    except OSError as exc:
        print(f"stallwatch run: the dashboard could not start ({exc}); the job runs without it", file=sys.stderr)
        return None


def _stop_dashboard(proc: Any) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except Exception:
        proc.kill()
        proc.wait()


def _at_a_terminal() -> bool:
    """Whether a person is watching: stallwatch's own output (stderr) goes to a terminal."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (ValueError, OSError):  # closed or odd
        return False


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


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is not within 0-65535")
    return value


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the dashboard until Ctrl-C; every reason it cannot start is one line and exit 2."""
    try:
        from stallwatch.present.dashboard.server import DashboardError, listen, open_served, serve
    except ImportError as exc:
        print(f"stallwatch dashboard: {exc.name or exc} is not installed: pip install 'stallwatch[dashboard]'",
              file=sys.stderr)
        return 2
    from stallwatch.present.dashboard.security import is_loopback

    try:
        served = open_served(args.root, wait_s=max(args.wait, 0.0))
        listening, policy = listen(args.host, args.port, args.token)
    except DashboardError as exc:
        print(f"stallwatch dashboard: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and args.token is None:
        print(f"stallwatch dashboard: listening on {args.host}, beyond this machine: every request needs the "
              "token in the URL below (give your own with --token)", file=sys.stderr)
    try:
        serve(served, listening, policy, open_browser=args.open)
    except KeyboardInterrupt:
        pass
    return 0


def _print_json_summary(uri: str, result: Any, results: list | None) -> None:
    """`stallwatch run --json`: the summary document on stderr (stdout is the job's), findings.json written."""
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present import json_out

    try:
        analysis = RunAnalysis(uri, rule_results=results)
        document = json_out.summary_json(analysis, result.node)
        analysis.write_findings()
    except Exception as exc:
        document = {"run": result.run_uri, "exit": {"code": result.exit_code, "signal": result.exit_signal},
                    "error": f"summary unavailable: {type(exc).__name__}: {exc}"}
    print(json_out.dumps(document), file=sys.stderr)


def _finish_rules(live: Any, uri: str, quiet: bool = False) -> list | None:
    """The rules' last evaluation after the job, and their summary printed (unless `quiet`); None when they
    could not be evaluated (said in one line)."""
    from stallwatch.present.rules_table import rules_table

    try:
        results = live.finish(uri)
    except Exception as exc:
        print(f"stallwatch: the rules could not be evaluated ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None
    try:  # a job that ended before its first step: the rules say so, not "was it run under stallwatch run?"
        from stallwatch.analyze.analysis import RunAnalysis

        results = RunAnalysis(uri, rule_results=results).rule_results
    except Exception:
        pass
    if not quiet:
        print("\n" + rules_table(results), file=sys.stderr)
    return results


def _print_findings(uri: str, results: list | None) -> None:
    """What to fix first, after the rules' summary, and findings.json into the run. Best effort."""
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present.console import findings_text

    try:
        analysis = RunAnalysis(uri, rule_results=results)
        text = findings_text(analysis.findings)
        analysis.write_findings()
    except Exception as exc:
        print(f"stallwatch: the findings could not be made ({type(exc).__name__}: {exc})", file=sys.stderr)
        return
    print("\n" + text, file=sys.stderr)


def _write_run_report(uri: str, results: list | None) -> None:
    """The end of `stallwatch run`: report.html into the run (the rules' results just evaluated are used, not
    evaluated again), its path the last line. Best effort: a failure is one line, never the exit code."""
    try:
        from stallwatch.present.report import build_report

        where = build_report(uri, rule_results=results)
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
    """Best effort: a summary that cannot be read (e.g. S3 down) is one line, never a failure. Reads only
    this node's summary columns, so a day-long run costs seconds and megabytes, not gigabytes."""
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.analyze.usage import NodeSpan
    from stallwatch.present.console import run_summary

    try:
        # Data that could not be uploaded is still complete in the local spool, itself a readable run.
        analysis = RunAnalysis(result.local_copy or result.run_uri)
        frame = analysis.system(result.node, ())
        spans = [NodeSpan(result.node, len(frame), int(frame.timestamps.min()), int(frame.timestamps.max()))] \
            if len(frame) else []
        windows = [w for w in analysis.profiles() if w.get("node") == result.node]
        text = run_summary(run_uri=result.run_uri, exit_code=result.exit_code, start_us=result.start_us,
                           end_us=result.end_us, spans=spans, stats=analysis.usage(result.node),
                           sample_interval_ms=config.sample_interval_ms, steps=analysis.step_stats(result.node),
                           windows=windows, exit_signal=result.exit_signal, interrupted=result.interrupted,
                           notes=analysis.notes)
        if config.price_per_hour is not None and analysis.cost is not None:
            from stallwatch.present.summary import cost_text

            text += "\n" + cost_text(analysis.cost)
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


def _open_engine(command: str, spec: str) -> Any:
    """The engine `--engine` names, started (a local Dask cluster) or reached (a scheduler); None after
    saying in one line why it cannot be."""
    from stallwatch.analyze.engine import EngineError, open_engine

    try:
        return open_engine(spec)
    except EngineError as exc:
        print(f"stallwatch {command}: {exc}", file=sys.stderr)
        return None


def _add_engine_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default="local", metavar="local|dask[=ADDRESS]",
                   help="where the per-node and per-slice work runs: local (default, this process), dask (a local "
                        "Dask cluster) or dask=tcp://HOST:8786 (an existing scheduler; its workers read the run "
                        "from its path or s3:// URI). Needs pip install 'stallwatch[dask]'")


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """An error as one short line (pyarrow's S3 errors run over several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


def cmd_info(args: argparse.Namespace) -> int:
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present.info import render_info

    run = _open("info", args.run)
    if run is None:
        return 2
    if args.json:
        from stallwatch.present import json_out

        print(json_out.dumps(json_out.info_json(RunAnalysis(run))))
        return 0
    print(render_info(RunAnalysis(run)))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write the run's HTML report (report.html in the run, or -o FILE) and print where it went."""
    opened = _open_with_rules("report", args)
    if opened is None:
        return 2
    run, custom, params = opened
    try:
        from stallwatch.analyze.analysis import RunAnalysis
        from stallwatch.present.progress import Progress
        from stallwatch.present.report import build_report

        baseline = None
        if args.baseline:
            base_run = _open("report", args.baseline)
            if base_run is None:
                return 2
            baseline = RunAnalysis(base_run, rules=custom, params=params)
        engine = _open_engine("report", args.engine)
        if engine is None:
            return 2
        try:
            with Progress("report", unit="sections") as bar:
                where = build_report(RunAnalysis(run, rules=custom, params=params, price_per_hour=args.price_per_hour,
                                                 baseline=baseline, engine=engine), args.output, progress=bar.update)
        finally:
            engine.close()
    except ImportError as exc:
        print(f"stallwatch report: {exc.name or exc} is not installed: pip install 'stallwatch[dashboard]'",
              file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"stallwatch report: the report could not be written ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    print(where)
    return 0


def _add_price_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--price-per-hour", type=_price, metavar="AMOUNT",
                   help="what one node costs per hour (any currency; default: the run's price_per_hour): adds the "
                        "run's cost and right-sizing advice")


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (what one node costs per hour)") from None
    if not 0 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text} must be from 0 to 1000000")
    return value


def cmd_compare(args: argparse.Namespace) -> int:
    """A run against a baseline, as text or JSON; exit 1 with --fail-if-slower when steps regressed."""
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present import json_out
    from stallwatch.present.compare import comparison_text

    base_run = _open("compare", args.baseline)
    if base_run is None:
        return 2
    run = _open("compare", args.run)
    if run is None:
        return 2
    baseline = RunAnalysis(base_run, price_per_hour=args.price_per_hour)
    analysis = RunAnalysis(run, price_per_hour=args.price_per_hour, baseline=baseline)
    comparison = analysis.comparison
    slower = comparison.slower_pct(args.mode, args.quantile)
    failed = args.fail_if_slower is not None and slower is not None and slower > args.fail_if_slower
    if args.json:
        doc = json_out.compare_json(analysis)
        doc["cost"] = {"baseline": baseline.cost.to_json() if baseline.cost else None,
                       "run": analysis.cost.to_json() if analysis.cost else None}
        doc["regression"] = {"mode": args.mode, "quantile": args.quantile, "slower_pct": slower,
                             "fail_if_slower": args.fail_if_slower, "failed": failed}
        print(json_out.dumps(doc))
    else:
        print(comparison_text(comparison, baseline.cost, analysis.cost))
    if args.fail_if_slower is not None:
        if slower is None:
            print(f"stallwatch compare: no {args.mode} steps in both runs: cannot tell whether it is slower",
                  file=sys.stderr)
            return 2
        if failed:
            print(f"stallwatch compare: {args.mode} step time p{round(args.quantile * 100)} is {slower:.1f} % slower "
                  f"than the baseline's (limit {args.fail_if_slower:g} %)", file=sys.stderr)
            return 1
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from stallwatch.store.location import RunLocation
    from stallwatch.store.transfer import copy_run

    run = _open("upload", args.source)
    if run is None:
        return 2
    from stallwatch.present.progress import Progress

    try:
        with Progress("upload", unit="B") as bar:
            result = copy_run(run.location, RunLocation(args.dest), delete_source=args.delete, progress=bar.update)
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
    from stallwatch.store import run_files

    run = _open("config", args.run)
    if run is None:
        return 2
    try:
        current = run_files.read_config(run.location)
    except FileNotFoundError:
        current = ProfilerConfig()
    except (ConfigError, OSError) as exc:
        print(f"stallwatch config: the run's config.json is invalid ({_one_line(exc)}); fix or replace it",
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
    run_files.write_config(run.location, updated)
    for name in sorted({**changes, **clears}):
        print(f"{name}: {_show(getattr(current, name))} -> {_show(getattr(updated, name))}")
    return 0


def _show(value: Any) -> str:
    return value.to_spec() if isinstance(value, ProfilingRange) else json.dumps(value)


def cmd_rules(args: argparse.Namespace) -> int:
    """Evaluate the rules on a run (finished or running), write rules/<RuleName>.json, print the summary.
    Custom rules run only when named here (`--custom-rule`): never because the run's config names them."""
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.rules.by_node import evaluate_run
    from stallwatch.analyze.rules.feed import count_slices
    from stallwatch.analyze.rules.live import follow
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.present.progress import Progress
    from stallwatch.present.rules_table import rules_table

    opened = _open_with_rules("rules", args)
    if opened is None:
        return 2
    run, custom, params = opened
    _say_recorded_custom_rules(run, custom)
    try:
        known = builtin_rules() + [c for c in custom if c not in builtin_rules()]
        classes = [_rule_named(n, known) for n in args.rule] if args.rule else known
        if args.follow:
            if args.engine != "local":
                raise ParameterError("--follow evaluates new data as it arrives, in this process: "
                                     "leave out --engine")
            results = follow(run, classes, params, every_s=args.every,
                             on_results=lambda res, final: _follow_line(run, res, final, args.json))
        else:
            engine = _open_engine("rules", args.engine)
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


def _open_with_rules(command: str, args: argparse.Namespace) -> tuple[Any, list, dict] | None:
    """The run, the custom rules named with --custom-rule and the rule parameters given with --param; None after
    saying what is wrong."""
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.rules.registry import builtin_rules, parse_params

    run = _open(command, args.run)
    if run is None:
        return None
    try:
        custom = _custom_rules(command, args)
    except ValueError:
        return None
    try:
        params = parse_params(getattr(args, "param", None) or [],
                              builtin_rules() + [c for c in custom if c not in builtin_rules()])
    except ParameterError as exc:
        print(f"stallwatch {command}: {exc}", file=sys.stderr)
        return None
    return run, custom, params


def _custom_rules(command: str, args: argparse.Namespace) -> list:
    """The custom rules the person named with --custom-rule, loaded; a bad one is said, and raises ValueError."""
    from stallwatch.analyze.rules.base import ParameterError
    from stallwatch.analyze.rules.registry import load_custom

    try:
        return load_custom(tuple(getattr(args, "custom_rules", None) or ()))
    except ParameterError as exc:
        print(f"stallwatch {command}: {exc}", file=sys.stderr)
        raise ValueError(str(exc)) from None


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
    from stallwatch.analyze.rules.runner import write_results

    try:
        write_results(run.location, results)
    except OSError as exc:
        print(f"stallwatch rules: cannot write the results into {run.uri} ({exc})", file=sys.stderr)


def _follow_line(run: Any, results: list, final: bool, to_stderr: bool = False) -> None:
    """One line per live evaluation: which rules fire so far; the files are rewritten each time. With --json
    the lines go to stderr, so stdout holds the one document at the end."""
    from datetime import datetime, timezone

    _write_rules(run, results)
    fired = ", ".join(f"{r.name} ({r.triggered})" for r in sorted(results, key=lambda r: -r.triggered) if r.triggered)
    print(f"{datetime.now(timezone.utc):%H:%M:%S} {'final' if final else 'so far'}: "
          f"{fired or 'no rule triggered'}", flush=True, file=sys.stderr if to_stderr else sys.stdout)


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
    from stallwatch.present.progress import Progress

    engine = _open_engine("timeline", args.engine)
    if engine is None:
        return 2
    try:
        with Progress("timeline", unit="nodes") as bar:
            s = export_timeline(run, out, start_us=start, end_us=end, max_points=args.max_points,
                                max_events=args.max_events, all_metrics=args.all_metrics, profiler=args.profiler,
                                progress=bar.update, engine=engine)
    except OSError as exc:
        print(f"stallwatch timeline: cannot write {out} ({exc})", file=sys.stderr)
        return 1
    finally:
        engine.close()
    logger.info("timeline: %d framework events, %d counter tracks (%d points), %d detailed profiling window(s)",
                s.framework_events, s.counter_series, s.counter_points, s.profiler_windows)
    print(s.path)
    return 0


def cmd_import_sagemaker(args: argparse.Namespace) -> int:
    """Turn a SageMaker Debugger profiler output into a run (the logic lives in stallwatch.importers.sagemaker)."""
    from stallwatch.importers.sagemaker.command import run_import

    return run_import(args.source, args.out)


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


def _add_json_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true", help=f"machine-readable: {what}, nothing else there")


def _add_param_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", action="append", metavar="RULE.KEY=VALUE",
                   help="a rule parameter, e.g. StepOutlier.stddev=2 (repeatable): the rules are evaluated again "
                        "with it")


def _add_custom_rule_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--custom-rule", dest="custom_rules", action="append", metavar="MODULE:CLASS",
                   help="also evaluate this rule of yours (module.path:Class or file.py:Class; repeatable). A run's "
                        "own configuration never makes stallwatch load code")


def build_parser() -> argparse.ArgumentParser:
    from stallwatch import __version__

    parser = argparse.ArgumentParser(
        prog="stallwatch", description="Profile deep-learning training jobs.",
        epilog="Exit codes: 0 ok; 1 findings or a regression you asked to fail on (--fail-on); 2 a usage or input "
               "error (a bad flag, not a run, a file that cannot be read or written). `stallwatch run` exits with "
               "its command's exit code.")
    parser.add_argument("--version", action="version", version=f"stallwatch {__version__}")
    quiet_help = "no progress and no informational lines on stderr (warnings and errors still)"
    parser.add_argument("-q", "--quiet", action="store_true", help=quiet_help)
    common = argparse.ArgumentParser(add_help=False)  # -q also after the subcommand, without resetting it
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=quiet_help)
    subparsers = parser.add_subparsers(dest="cmd", required=True)

    class _Sub:
        @staticmethod
        def add_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
            return subparsers.add_parser(name, parents=[common], **kwargs)

    sub = _Sub()
    p = sub.add_parser("run", help="run a command under the profiler",
                       usage="stallwatch run [options] -- CMD [ARGS...]")
    _add_config_flags(p)
    p.add_argument("--json", action="store_true",
                   help="end with the run's summary as one JSON document on stderr instead of text (stdout is "
                        "the command's own)")
    p.add_argument("--dashboard", nargs="?", const=8050, type=_port, metavar="PORT",
                   help="serve the live dashboard of this run on 127.0.0.1:PORT (default 8050) while it runs, in a "
                        "process of its own")
    p.add_argument("--report", choices=list(report_timing.MODES), default=report_timing.AUTO,
                   help="the HTML report after the job: auto (default) = background at a terminal, wait elsewhere "
                        "(scripts, CI, Slurm, containers); wait = built before returning (it exists when the command "
                        "returns); background = a detached process builds it and the job's status returns at once "
                        "(report.html reloads itself until it is there); off = not built (`stallwatch report RUN`)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("rules", help="evaluate the profiler rules on a run and write rules/<RuleName>.json")
    p.add_argument("run", help="run directory or s3:// URI")
    _add_engine_flag(p)
    p.add_argument("--rule", action="append", metavar="NAME", help="only this rule (repeatable)")
    _add_param_flag(p)
    p.add_argument("--follow", action="store_true",
                   help="evaluate a running job's new data as it arrives, until the job ends")
    p.add_argument("--every", type=float, default=10.0, metavar="SECONDS", help="with --follow (default 10)")
    _add_custom_rule_flag(p)
    _add_json_flag(p, "the results as one JSON document on stdout")
    p.set_defaults(func=cmd_rules)
    p = sub.add_parser("info", help="what a run holds: nodes, ranks, time span, metrics, size")
    p.add_argument("run", help="run directory or s3:// URI")
    _add_json_flag(p, "one JSON document on stdout")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("summary", help="a run's summary and what to fix first (what `stallwatch run` prints at the "
                                       "end), for any run")
    p.add_argument("run", help="run directory or s3:// URI")
    p.add_argument("--node", metavar="NAME", help="only this node's usage and steps")
    p.add_argument("--fail-on", choices=["any", "low", "medium", "high"], metavar="SEVERITY",
                   help="exit 1 when a finding of this severity or higher was found (any, low, medium, high)")
    _add_price_flag(p)
    _add_param_flag(p)
    _add_custom_rule_flag(p)
    _add_json_flag(p, "one JSON document on stdout")
    p.set_defaults(func=cmd_summary)
    p = sub.add_parser("ls", help="the runs in a folder or bucket prefix, newest first")
    p.add_argument("root", nargs="?", default="stallwatch-runs",
                   help="a folder of runs or s3://bucket/prefix (default ./stallwatch-runs)")
    _add_json_flag(p, "one JSON document on stdout")
    p.set_defaults(func=cmd_ls)
    p = sub.add_parser("completion", help="print the shell completion script (bash, zsh or fish)")
    p.add_argument("shell", choices=["bash", "zsh", "fish"])
    p.set_defaults(func=cmd_completion)
    p = sub.add_parser("report", help="write the run's interactive HTML report (one file that opens offline)")
    p.add_argument("run", help="run directory or s3:// URI")
    _add_engine_flag(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write it here instead of report.html in the run")
    p.add_argument("--baseline", metavar="RUN", help="add a comparison with this run (e.g. before a change)")
    _add_price_flag(p)
    _add_param_flag(p)
    _add_custom_rule_flag(p)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("compare", help="compare a run with a baseline run: step times, phases, utilization, "
                                       "findings, operators")
    p.add_argument("baseline", help="the baseline run (directory or s3:// URI)")
    p.add_argument("run", help="the run to compare with it")
    p.add_argument("--fail-if-slower", type=float, metavar="PCT",
                   help="exit 1 when the run's training steps are more than PCT %% slower than the baseline's at "
                        "--quantile (for CI pipelines)")
    p.add_argument("--quantile", type=float, default=0.5, choices=[0.5, 0.9, 0.99], metavar="Q",
                   help="the step-time quantile --fail-if-slower compares: 0.5 (default), 0.9 or 0.99")
    p.add_argument("--mode", default="TRAIN", choices=["TRAIN", "EVAL", "GLOBAL"],
                   help="the steps --fail-if-slower compares (default TRAIN)")
    _add_price_flag(p)
    _add_json_flag(p, "one JSON document on stdout")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("config", help="show a run's profiling config, or change it while the job runs")
    p.add_argument("run", help="run directory or s3:// URI")
    live = p.add_argument_group("live profiling configuration")
    live.add_argument("--interval", dest="sample_interval_ms", type=parse_interval_ms, metavar="DURATION",
                      help="system sampling interval from now on, 100ms … 60s (presets 100ms 200ms 500ms 1s 5s 1m); "
                           "the node records say when each node picked it up")
    _add_live_flags(live)
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
    _add_engine_flag(p)
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
    p = sub.add_parser("dashboard", help="serve the live insights dashboard of a run, or of a folder or bucket of runs")
    p.add_argument("root", nargs="?", default="stallwatch-runs",
                   help="a run, a folder of runs or s3://bucket/prefix (default ./stallwatch-runs)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs a token, generated unless given)")
    p.add_argument("--port", type=_port, default=8050, help="port (default 8050; 0: any free one)")
    p.add_argument("--token", metavar="TOKEN", help="require this token (in the printed URL, then a cookie)")
    p.add_argument("--open", action="store_true", help="open the dashboard in the default browser")
    p.add_argument("--wait", type=float, default=0.0, help=argparse.SUPPRESS)  # seconds for the run to appear
    p.set_defaults(func=cmd_dashboard)
    p = sub.add_parser("import-sagemaker", help="turn a SageMaker Debugger profiler output into a run")
    p.add_argument("source", metavar="SRC", help="the job's profiler output: a folder or s3://BUCKET/JOB/profiler-output")
    p.add_argument("--out", metavar="RUN", help="the new run (a path or s3:// URI; default ./stallwatch-runs/<run-id>)")
    p.set_defaults(func=cmd_import_sagemaker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from stallwatch.collect.stdio import hold_closed_standard_fds

    hold_closed_standard_fds()  # before anything opens a file
    configure_cli_logging()
    parser = build_parser()
    _complete(parser)
    args = parser.parse_args(argv)
    if args.quiet:
        import logging

        from stallwatch.present import progress

        progress.QUIET = True
        logger.setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except OSError as exc:  # a store that stopped answering halfway (S3 down, a disk gone): one line, no traceback
        print(f"stallwatch {args.cmd}: {_one_line(exc)}", file=sys.stderr)
        return 2


def _complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request (argcomplete sets _ARGCOMPLETE), otherwise nothing."""
    import os

    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(parser)


def cmd_completion(args: argparse.Namespace) -> int:
    """The completion script for the shell, generated from this parser by argcomplete: `eval "$(stallwatch
    completion bash)"` in ~/.bashrc (zsh the same; fish: `stallwatch completion fish | source`)."""
    import argcomplete

    print(argcomplete.shellcode(["stallwatch"], shell=args.shell))
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    """A run's summary and findings, as `stallwatch run` prints them at the end (text or --json)."""
    opened = _open_with_rules("summary", args)
    if opened is None:
        return 2
    run, custom, params = opened
    from stallwatch.analyze.analysis import RunAnalysis
    from stallwatch.present import json_out
    from stallwatch.present.summary import summary_text

    analysis = RunAnalysis(run, rules=custom, params=params, price_per_hour=args.price_per_hour)
    if args.node and args.node not in analysis.nodes:
        print(f"stallwatch summary: no node {args.node!r} in {run.uri}; its nodes: {', '.join(analysis.nodes)}",
              file=sys.stderr)
        return 2
    if args.json:
        print(json_out.dumps(json_out.summary_json(analysis, args.node)))
    else:
        print(summary_text(analysis, args.node))
    return 1 if _fails(analysis.findings, args.fail_on) else 0


def _fails(findings: Any, fail_on: str | None) -> bool:
    """A finding at `fail_on` or above (any: any finding at all)."""
    if fail_on is None:
        return False
    order = {"low": 0, "medium": 1, "high": 2}
    floor = -1 if fail_on == "any" else order[fail_on]
    return any(order.get(f.severity, 0) >= floor for f in findings.findings)


def cmd_ls(args: argparse.Namespace) -> int:
    """The runs under a folder or bucket prefix (or the run itself), from their records alone."""
    from stallwatch.analyze.catalog import run_rows
    from stallwatch.present import console, json_out
    from stallwatch.store.catalog import list_runs

    try:
        rows = run_rows(list_runs(args.root))
    except (OSError, ValueError) as exc:
        print(f"stallwatch ls: cannot list {args.root} ({exc})", file=sys.stderr)
        return 2
    if args.json:
        print(json_out.dumps(json_out.runs_json(args.root, rows)))
    elif rows:
        print(console.runs_table(rows))
    else:
        print(f"stallwatch ls: no runs in {args.root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
