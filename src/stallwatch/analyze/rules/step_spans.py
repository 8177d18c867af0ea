"""Where each span of step numbers lies in time, per node and phase: what a node read again in step order needs."""

from __future__ import annotations

import numpy as np

from stallwatch.analyze.framework_frame import FrameworkColumns


def track_spans(cols: FrameworkColumns, numbered: np.ndarray, spans: dict[str, dict[str, dict[int, list[int]]]],
                rates: dict[str, list[int]]) -> None:
    """What reading a node again needs (batch feeds): per node and phase, where each span of step numbers of the
    `numbered` rows lies in time (`step_stream.widen`, a rank's rows at a time); per node, how many of them there
    are between their first and last start (the rate it is read at)."""
    from stallwatch.analyze.rules import step_stream

    for (node, _, mode), rows in cols.groups(numbered):
        step_stream.widen(spans.setdefault(node, {}).setdefault(mode, {}), cols.step[rows], cols.start[rows])
        lo, hi = int(cols.start[rows].min()), int(cols.start[rows].max())
        seen = rates.setdefault(node, [0, lo, hi])
        seen[0] += len(rows)
        seen[1], seen[2] = min(seen[1], lo), max(seen[2], hi)
