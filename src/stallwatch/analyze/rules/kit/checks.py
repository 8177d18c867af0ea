"""What every rule shares: parameter checks, patience, and how numbers, times and lists are written."""

from __future__ import annotations

import datetime as _dt
import math

from stallwatch.analyze.rules.base import ParameterError, Rule

_MAX_LISTED = 5  # findings a recommendation names before "and N more"


def check_counts(rule: Rule, *names: str) -> None:
    """`patience` must be >= 0, `window` >= 1: a clear error instead of a silent empty result."""
    for key in names:
        value = rule.params[key]
        low = 1 if key == "window" else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ParameterError(f"{rule.name}.{key}={value!r}: must be an integer >= {low}")


def check_non_negative(rule: Rule, *names: str) -> None:
    """Continuous parameters (thresholds, margins) must be finite numbers >= 0."""
    for key in names:
        value = rule.params[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ParameterError(f"{rule.name}.{key}={value!r}: must be a number >= 0")


def skip_patience(seen: int, n: int, patience: int) -> int:
    """How many of `n` new snapshots of a node still fall into its first `patience` (`seen` so far)."""
    return min(n, max(0, patience - seen))


def when(us: int | None) -> str:
    """µs since the epoch as readable UTC text (for recommendations)."""
    if us is None:
        return "-"
    return _dt.datetime.fromtimestamp(us / 1e6, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def rounded(stats: dict[str, float], digits: int = 4) -> dict[str, float]:
    """Statistics of float32-kept values, without float32's noise digits."""
    return {k: round(float(v), digits) for k, v in stats.items()}


def plain_float(x: float | None, digits: int = 4) -> float | None:
    """A JSON number (None for NaN)."""
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def listing(items: list[str]) -> str:
    shown = items[:_MAX_LISTED]
    more = f"; and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
    return "; ".join(shown) + more
