"""Timestamps are integers, µs since the Unix epoch (UTC), everywhere."""

from __future__ import annotations

import time
from datetime import datetime, timezone


def now_us() -> int:
    return time.time_ns() // 1000


def format_us(ts_us: int | None) -> str:
    if ts_us is None:
        return "-"
    return datetime.fromtimestamp(ts_us / 1e6, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_duration(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {sec:02d}s" if hours else f"{minutes}m {sec:02d}s"
