"""Node comparison: which node stands out, against the median of all nodes or, with two, the other one."""

from __future__ import annotations

from stallwatch.analyze import nodes


def test_odd_ones_rules():
    pct = nodes.USAGE["GPU"]
    assert nodes.odd_ones({"a": 80, "b": 81, "c": 79, "d": 60}, pct) == {"d": 79.5}
    assert nodes.odd_ones({"a": 80}, pct) == {}
    assert nodes.odd_ones({"a": 100.0, "b": 110.0, "c": 130.0}, nodes.STEP) == {"c": 110.0}
