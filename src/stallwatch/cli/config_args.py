"""`stallwatch run`'s configuration from its flags and --config file, checked before the job starts."""

from __future__ import annotations

import argparse

from stallwatch.config import ConfigError, ProfilerConfig
from stallwatch.log import logger

CONFIG_FLAGS = ("sample_interval_ms", "out", "runs_dir", "node", "flush_interval_s", "max_storage_mb",
                "upload_timeout_s", "gpu", "detailed_profiling", "dataloader_profiling", "python_profiling",
                "memory_profiling",
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
    changes = {k: getattr(args, k) for k in CONFIG_FLAGS if getattr(args, k, None) is not None}
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
