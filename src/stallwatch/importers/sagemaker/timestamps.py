"""SageMaker Debugger writes epoch times in seconds (system samples, minute file names), microseconds (trace file
names, `start_time_since_epoch_in_micros`) and nanoseconds (older trace file names); the unit is told apart by
magnitude, as any real epoch time of the last fifty years has a distinct order of magnitude in each unit."""

from __future__ import annotations

import numpy as np

# Boundaries between units for epoch times: 1e11 s is the year 5138, 1e11 ms is 1973, 1e14 µs is 1973,
# 1e17 ns is 1973; so an epoch time after 1973 and before 5138 has one reading.
_S_BELOW = 1e11
_MS_BELOW = 1e14
_US_BELOW = 1e17


def epoch_to_us(value: float | int) -> int:
    """An epoch time in s, ms, µs or ns -> µs (int)."""
    v = float(value)
    if v < _S_BELOW:
        return int(round(v * 1e6))
    if v < _MS_BELOW:
        return int(round(v * 1e3))
    if v < _US_BELOW:
        return int(value) if isinstance(value, int) else int(round(v))
    return int(value) // 1000 if isinstance(value, int) else int(round(v / 1e3))


def epoch_to_us_array(values: np.ndarray) -> np.ndarray:
    """`epoch_to_us` of a float64 array (NaN stays NaN: the caller drops it)."""
    v = np.asarray(values, dtype=np.float64)
    out = np.where(v < _S_BELOW, v * 1e6, np.where(v < _MS_BELOW, v * 1e3, np.where(v < _US_BELOW, v, v / 1e3)))
    return np.round(out)


def epoch_from_text(text: str) -> int | None:
    """A file or directory name's time field ("1591160699", "1594662624718694", "1596585363775342.0",
    "1589314018481947000") -> µs; None when it is not a number."""
    try:
        value: float | int = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            return None
    if not np.isfinite(value) or value <= 0:
        return None
    return epoch_to_us(value)
