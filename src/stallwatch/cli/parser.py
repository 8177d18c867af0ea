"""The argument parser: every command, its flags and its help; each command's code is in its own module."""

from __future__ import annotations

import argparse
from typing import Any

from stallwatch.cli import flags
from stallwatch.cli.compare import cmd_compare
from stallwatch.cli.completion import cmd_completion
from stallwatch.cli.dashboard import cmd_dashboard
from stallwatch.cli.import_sagemaker import cmd_import_sagemaker
from stallwatch.cli.info import cmd_info
from stallwatch.cli.live_config import cmd_config
from stallwatch.cli.ls import cmd_ls
from stallwatch.cli.report import cmd_report
from stallwatch.cli.rules import cmd_rules
from stallwatch.cli.run import cmd_run
from stallwatch.cli.summary import cmd_summary
from stallwatch.cli.timeline import cmd_timeline
from stallwatch.cli.upload import cmd_upload
from stallwatch.collect import report_timing


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
    flags.add_config_flags(p)
    p.add_argument("--json", action="store_true",
                   help="end with the run's summary as one JSON document on stderr instead of text (stdout is "
                        "the command's own)")
    p.add_argument("--dashboard", nargs="?", const=8050, type=flags.port, metavar="PORT",
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
    flags.add_engine_flag(p)
    p.add_argument("--rule", action="append", metavar="NAME", help="only this rule (repeatable)")
    flags.add_param_flag(p)
    p.add_argument("--follow", action="store_true",
                   help="evaluate a running job's new data as it arrives, until the job ends")
    p.add_argument("--every", type=float, default=10.0, metavar="SECONDS", help="with --follow (default 10)")
    flags.add_custom_rule_flag(p)
    flags.add_json_flag(p, "the results as one JSON document on stdout")
    p.set_defaults(func=cmd_rules)
    p = sub.add_parser("info", help="what a run holds: nodes, ranks, time span, metrics, size")
    p.add_argument("run", help="run directory or s3:// URI")
    flags.add_json_flag(p, "one JSON document on stdout")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("summary", help="a run's summary and what to fix first (what `stallwatch run` prints at the "
                                       "end), for any run")
    p.add_argument("run", help="run directory or s3:// URI")
    p.add_argument("--node", metavar="NAME", help="only this node's usage and steps")
    p.add_argument("--fail-on", choices=["any", "low", "medium", "high"], metavar="SEVERITY",
                   help="exit 1 when a finding of this severity or higher was found (any, low, medium, high)")
    flags.add_price_flag(p)
    flags.add_param_flag(p)
    flags.add_custom_rule_flag(p)
    flags.add_json_flag(p, "one JSON document on stdout")
    p.set_defaults(func=cmd_summary)
    p = sub.add_parser("ls", help="the runs in a folder or bucket prefix, newest first")
    p.add_argument("root", nargs="?", default="stallwatch-runs",
                   help="a folder of runs or s3://bucket/prefix (default ./stallwatch-runs)")
    flags.add_json_flag(p, "one JSON document on stdout")
    p.set_defaults(func=cmd_ls)
    p = sub.add_parser("completion", help="print the shell completion script (bash, zsh or fish)")
    p.add_argument("shell", choices=["bash", "zsh", "fish"])
    p.set_defaults(func=cmd_completion)
    p = sub.add_parser("report", help="write the run's interactive HTML report (one file that opens offline)")
    p.add_argument("run", help="run directory or s3:// URI")
    flags.add_engine_flag(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write it here instead of report.html in the run")
    p.add_argument("--baseline", metavar="RUN", help="add a comparison with this run (e.g. before a change)")
    flags.add_price_flag(p)
    flags.add_param_flag(p)
    flags.add_custom_rule_flag(p)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("compare", help="compare a run with a baseline run: step times, phases, utilization, "
                                       "findings, operators")
    p.add_argument("baseline", help="the baseline run (directory or s3:// URI)")
    p.add_argument("run", help="the run to compare with it")
    p.add_argument("--fail-if-slower", type=flags.percent, metavar="PCT",
                   help="exit 1 when the run's training steps are more than PCT %% slower than the baseline's at "
                        "--quantile (for CI pipelines)")
    p.add_argument("--quantile", type=float, default=0.5, choices=[0.5, 0.9, 0.99], metavar="Q",
                   help="the step-time quantile --fail-if-slower compares: 0.5 (default), 0.9 or 0.99")
    p.add_argument("--mode", default="TRAIN", choices=["TRAIN", "EVAL", "GLOBAL"],
                   help="the steps --fail-if-slower compares (default TRAIN)")
    flags.add_price_flag(p)
    flags.add_json_flag(p, "one JSON document on stdout")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("config", help="show a run's profiling config, or change it while the job runs")
    p.add_argument("run", help="run directory or s3:// URI")
    live = p.add_argument_group("live profiling configuration")
    live.add_argument("--interval", dest="sample_interval_ms", type=flags.parse_interval_ms, metavar="DURATION",
                      help="system sampling interval from now on, 100ms … 60s (presets 100ms 200ms 500ms 1s 5s 1m); "
                           "the node records say when each node picked it up")
    flags.add_live_flags(live)
    live.add_argument("--dump-stacks", dest="ask_stacks", action="store_true",
                      help="ask every process of the running job for the Python stacks of all its threads (kept "
                           "under stacks/ in the run)")
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
    flags.add_engine_flag(p)
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write it (default ./<run-id>-timeline.json.gz; gzipped when it ends in .gz)")
    p.add_argument("--start", metavar="TIME", help="only from here: seconds from the run's start or an ISO time (UTC)")
    p.add_argument("--end", metavar="TIME", help="only up to here: seconds from the run's start or an ISO time (UTC)")
    p.add_argument("--max-points", type=flags.at_least(2), default=10_000, metavar="N",
                   help="points per counter track at most; min/max per time bucket keeps spikes (default 10000)")
    p.add_argument("--max-events", type=flags.at_least(0), default=1_000_000, metavar="N",
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
                   help="address to listen on (default 127.0.0.1; every bind needs a token, generated unless given)")
    p.add_argument("--port", type=flags.port, default=8050, help="port (default 8050; 0: any free one)")
    p.add_argument("--token-file", metavar="FILE",
                   help="require the token this file holds (or set STALLWATCH_DASHBOARD_TOKEN; default: a new one, "
                        "printed in the URL, then a cookie)")
    p.add_argument("--token", metavar="TOKEN", help=argparse.SUPPRESS)  # visible in the process list: said so
    p.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)  # run --dashboard: end with it
    p.add_argument("--open", action="store_true", help="open the dashboard in the default browser")
    p.add_argument("--wait", type=float, default=0.0, help=argparse.SUPPRESS)  # seconds for the run to appear
    p.set_defaults(func=cmd_dashboard)
    p = sub.add_parser("import-sagemaker", help="turn a SageMaker Debugger profiler output into a run")
    p.add_argument("source", metavar="SRC", help="the job's profiler output: a folder or s3://BUCKET/JOB/profiler-output")
    p.add_argument("--out", metavar="RUN", help="the new run (a path or s3:// URI; default ./stallwatch-runs/<run-id>)")
    p.set_defaults(func=cmd_import_sagemaker)
    return parser
