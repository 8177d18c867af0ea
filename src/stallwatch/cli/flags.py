"""The flags several commands share and the types that check their values (a bad value is a usage error)."""

from __future__ import annotations

import argparse
import math
import re

from stallwatch.config import ConfigError, ProfilingRange

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min)?\s*$")


def parse_interval_ms(text: str) -> int:
    """'500ms', '0.5s', '1m' or a bare number of milliseconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid interval {text!r}: use e.g. 100ms, 500ms, 1s, 5s, 1m")
    value, unit = float(m.group(1)), m.group(2) or "ms"
    factor = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000}[unit]
    return int(round(value * factor))


def range_arg(name: str):
    def parse(text: str) -> ProfilingRange:
        try:
            return ProfilingRange.parse(name, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is not within 0-65535")
    return value


def percent(text: str) -> float:
    """A finite percentage of 0 or more: `--fail-if-slower nan` (or inf) made a CI gate that could not fail."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of percent") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage of 0 or more (e.g. 5 for 5 %% slower)")
    return value


def price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (what one node costs per hour)") from None
    if not 0 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text} must be from 0 to 1000000")
    return value


def at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, at least {minimum}")
        return value
    return parse


def add_config_flags(p: argparse.ArgumentParser) -> None:
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
    add_live_flags(g)


def add_live_flags(g: argparse._ArgumentGroup) -> None:
    """The fields a running job picks up from config.json (LIVE_FIELDS)."""
    g.add_argument("--detailed-profiling", type=range_arg("detailed_profiling"), metavar="START:NUM|TIME/SECONDS",
                   help="torch.profiler for these steps or this time window")
    g.add_argument("--dataloader-profiling", type=range_arg("dataloader_profiling"), metavar="START:NUM|TIME/SECONDS")
    g.add_argument("--python-profiling", type=range_arg("python_profiling"), metavar="START:NUM|TIME/SECONDS")
    g.add_argument("--memory-profiling", type=range_arg("memory_profiling"), metavar="START:NUM|TIME/SECONDS",
                   help="where memory grows: tracemalloc snapshots 5 steps apart from this step or time (and CUDA's "
                        "allocator history); MemoryGrowth asks for one on its own when it fires live")
    g.add_argument("--python-profiler", choices=["cprofile", "pyinstrument"])
    g.add_argument("--cprofile-timer", choices=["total", "cpu", "off_cpu"])
    g.add_argument("--stop-training", metavar="REASON",
                   help="stop training at the next step boundary (recorded with this reason)")


def add_engine_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default="local", metavar="local|dask[=ADDRESS]",
                   help="where the per-node and per-slice work runs: local (default, this process), dask (a local "
                        "Dask cluster) or dask=tcp://HOST:8786 (an existing scheduler; its workers read the run "
                        "from its path or s3:// URI). Needs pip install 'stallwatch[dask]'")


def add_price_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--price-per-hour", type=price, metavar="AMOUNT",
                   help="what one node costs per hour (any currency; default: the run's price_per_hour): adds the "
                        "run's cost and right-sizing advice")


def add_json_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true", help=f"machine-readable: {what}, nothing else there")


def add_param_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", action="append", metavar="RULE.KEY=VALUE",
                   help="a rule parameter, e.g. StepOutlier.stddev=2 (repeatable): the rules are evaluated again "
                        "with it")


def add_custom_rule_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--custom-rule", dest="custom_rules", action="append", metavar="MODULE:CLASS",
                   help="also evaluate this rule of yours (module.path:Class or file.py:Class; repeatable). A run's "
                        "own configuration never makes stallwatch load code")
