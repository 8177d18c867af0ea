"""stallwatch: a self-hosted profiler for deep-learning training jobs.

Importing this package is cheap: torch, bokeh, boto3 and even pyarrow load only where they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from stallwatch.config import ProfilerConfig, ProfilingRange
    from stallwatch.store.reader import Run


def open_run(uri: str) -> Run:
    """Open a run directory (local path or s3:// URI) for reading."""
    from stallwatch.store.reader import open_run as _open

    return _open(uri)


def __getattr__(name: str) -> Any:
    if name in ("ProfilerConfig", "ProfilingRange", "ConfigError"):
        from stallwatch import config

        return getattr(config, name)
    raise AttributeError(f"module 'stallwatch' has no attribute {name!r}")


__all__ = ["open_run", "ProfilerConfig", "ProfilingRange", "ConfigError", "__version__"]
