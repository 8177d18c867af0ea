"""Property-based fuzzing (Hypothesis) shared by the tests of the config parser, the run-directory readers and
the event decoder: a small budget per test so CI stays fast, no example database written into the tree."""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


# STALLWATCH_FUZZ_SCALE=50 python -m pytest -k fuzz: a longer hunt on a developer's machine.
SCALE = float(os.environ.get("STALLWATCH_FUZZ_SCALE", "1"))


def fuzz(max_examples: int):
    """Settings for one fuzz test: no deadline (CI machines are shared and slow), bounded examples."""
    return settings(max_examples=max(1, int(max_examples * SCALE)), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


# Integers that break naive code: past int32, int64, float, and repr's 4,300-digit limit.
def _huge() -> int:
    return 10**5000


NASTY_INTS = st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, -(2**63) - 1, 2**70, 10**400]) | \
    st.builds(_huge)
NASTY_FLOATS = st.sampled_from([0.5, -0.0, 1e308, -1e308, math.inf, -math.inf, math.nan, 5e-324])
SCALARS = (st.none() | st.booleans() | st.integers() | NASTY_INTS | st.floats() | NASTY_FLOATS
           | st.text(max_size=30))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=5), max_leaves=25)


def json_bytes(value: object) -> bytes:
    """`value` as JSON text, as a hostile writer would put it (NaN and huge numbers included)."""
    import json
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return json.dumps(value).encode()
    finally:
        sys.set_int_max_str_digits(old)
