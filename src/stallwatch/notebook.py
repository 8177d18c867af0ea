"""The notebook views (`stallwatch.notebook`): kept at this short path for users; they live in the present
stage (`stallwatch.present.notebook`)."""

from stallwatch.present.notebook import (
    Heatmap,
    MetricsHistogram,
    StepHistogram,
    Timeline,
    findings,
)

__all__ = ["Heatmap", "MetricsHistogram", "StepHistogram", "Timeline", "findings"]
