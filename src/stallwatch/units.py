"""Units and number formatting, one place for every page: a stored unit (B/s, B, s, %…), the unit a chart's
axis shows it in (MB/s, GB…) and the ladder a single number climbs so it reads "1.2 kB/s", not "0.0012 MB/s",
and "350 ms", not "≈ 0.0 s". The dashboard gets these rules as JSON (`catalogue.to_json`) and applies them with
the same algorithm (static/format.js); tests hold the two to the same output."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any


@dataclass(frozen=True)
class Unit:
    """`axis` and `scale`: what a chart's axis shows (stored value × scale); `ladder`: (factor, name) pairs,
    largest first, a single formatted value takes the first whose factor it reaches (the last one below)."""
    axis: str
    scale: float = 1.0
    ladder: tuple[tuple[float, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"axis": self.axis, "scale": self.scale, "ladder": [list(step) for step in self.ladder]}


_BYTES = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B"))
UNITS: dict[str, Unit] = {
    "%": Unit("%"),
    "B/s": Unit("MB/s", 1e-6, tuple((f, f"{n}/s") for f, n in _BYTES)),
    "B": Unit("GB", 1e-9, _BYTES),
    "s": Unit("s", 1.0, ((3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))),
    "ms": Unit("ms", 1.0, ((1e3, "s"), (1.0, "ms"), (1e-3, "µs"))),
    "us": Unit("µs", 1.0, ((1e6, "s"), (1e3, "ms"), (1.0, "µs"))),
    "count": Unit(""),
    "W": Unit("W"),
    "°C": Unit("°C"),
    "MHz": Unit("MHz"),
    "Gb/s": Unit("Gb/s"),
}


def number(x: float) -> str:
    """Three significant digits, never scientific, thousands separated, no trailing zeros: 1,234 · 93.2 ·
    4.21 · 0.0123."""
    if x is None or not math.isfinite(x):
        return "–"
    if x == 0:
        return "0"
    a = abs(x)
    decimals = 0 if a >= 100 else max(0, 2 - math.floor(math.log10(a)))
    text = f"{x:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def format_value(value: Any, unit: str) -> str:
    """A value stored in `unit` as a person reads it: climbing the unit's ladder ("1.2 kB/s", "350 ms"),
    else the number and the unit ("93.2 %", "3 W"); "–" for a missing value."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "–"
    spec = UNITS.get(unit)
    if spec is not None and spec.ladder:
        a = abs(value)
        if a == 0:  # "0 s", not "0 µs"
            return f"0 {next((n for f, n in spec.ladder if f == 1.0), spec.ladder[-1][1])}"
        for factor, name in spec.ladder:
            if a >= factor * 0.9995:  # 999.8 kB/s reads "1 MB/s", not "1,000 kB/s"
                return f"{number(value / factor)} {name}"
        factor, name = spec.ladder[-1]
        return f"{number(value / factor)} {name}"
    if unit in ("", "count"):
        return number(value)
    return f"{number(value)} {unit}"


def axis(unit: str) -> tuple[str, float]:
    """A chart axis's unit and the factor from the stored unit (B/s: MB/s and 1e-6)."""
    spec = UNITS.get(unit)
    return (spec.axis, spec.scale) if spec is not None else (unit, 1.0)


# What a key's suffix says about its unit, for numbers shown by name (a finding's evidence, a rule's details).
SUFFIX_UNITS = (("_us", "us"), ("_ms", "ms"), ("_s", "s"), ("_pct", "%"), ("_percent", "%"), ("_share", "%"),
                ("_bytes", "B"), ("_bps", "B/s"), ("_gbps", "Gb/s"), ("_s_per_step", "s"), ("_ms_per_step", "ms"))
KEY_UNITS = {"share": "%", "percent": "%"}  # whole keys that name their unit
MOMENT_US = 1e15  # a µs value above this (2001 onwards) is a time since the epoch
PLAIN_KEYS = ("pid", "rank", "step", "port", "window", "code")  # identifiers: shown as they are (pid 6439)


def unit_of_key(key: str) -> str:
    """The unit a key's name says ("" when none): `time_at_stake_s` is seconds, `rss_bytes` bytes, `wait_share` %."""
    if key in KEY_UNITS:
        return KEY_UNITS[key]
    for suffix, unit in SUFFIX_UNITS:
        if key.endswith(suffix):
            return unit
    return ""


def format_keyed(key: str, value: Any) -> str:
    """A named value as text, by what its name says: identifiers as they are, numbers in the unit the name
    names (`format_value`), true/false as yes/no; what the dashboard does for a finding's evidence."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        plain = key in PLAIN_KEYS or key.endswith(tuple(f"_{k}" for k in PLAIN_KEYS))
        if plain and float(value).is_integer():  # an identifier is whole: `excess_s_per_step` 0.045 is a time
            return str(value)
        unit = unit_of_key(key)
        if unit == "us" and value > MOMENT_US:  # a moment, not a duration
            return datetime.fromtimestamp(value / 1e6, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return format_value(value, unit)
    return str(value)


def to_json() -> dict[str, Any]:
    """The units and the rules for named values, as the dashboard applies them."""
    return {"units": {name: u.to_json() for name, u in UNITS.items()}, "suffix_units": [list(x) for x in SUFFIX_UNITS],
            "key_units": dict(KEY_UNITS), "plain_keys": list(PLAIN_KEYS),
            "moment_us": MOMENT_US}
