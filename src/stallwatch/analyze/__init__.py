"""The analysis stage: rules and statistics over a run's data, behind one façade (`RunAnalysis`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stallwatch.analyze.analysis import RunAnalysis


def __getattr__(name: str) -> Any:
    if name == "RunAnalysis":
        from stallwatch.analyze.analysis import RunAnalysis

        return RunAnalysis
    raise AttributeError(f"module 'stallwatch.analyze' has no attribute {name!r}")


__all__ = ["RunAnalysis"]
