"""Importing stallwatch is cheap: no heavy dependency loads until it is used."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "bokeh", "boto3", "botocore", "pyarrow", "keras", "jax", "tensorflow")

_PROBE = """
import json, sys
import stallwatch
import stallwatch.keras  # the Keras integration's package imports no Keras until its callback is used
before = sorted(m for m in {heavy!r} if m in sys.modules)
cfg = stallwatch.ProfilerConfig(sample_interval_ms=200, python_profiling=stallwatch.ProfilingRange.parse("p", "3:2"))
err = stallwatch.ConfigError
after = sorted(m for m in {heavy!r} if m in sys.modules)
print(json.dumps({{"before": before, "after": after, "interval": cfg.sample_interval_ms,
                  "steps": cfg.python_profiling.num_steps, "err": err.__name__}}))
"""


def _probe() -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY)], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def test_import_and_config_load_no_heavy_modules():
    """`import stallwatch` and the lazy ProfilerConfig leave torch, bokeh, boto3 and pyarrow unloaded."""
    got = _probe()
    assert got["before"] == []
    assert got["after"] == []
    assert got["interval"] == 200 and got["steps"] == 2 and got["err"] == "ConfigError"


def test_lazy_names_are_the_config_module_objects():
    """The lazily resolved names are the same objects as in stallwatch.config; unknown names raise."""
    import pytest

    import stallwatch
    from stallwatch import config

    assert stallwatch.ProfilerConfig is config.ProfilerConfig
    assert stallwatch.ProfilingRange is config.ProfilingRange
    assert stallwatch.ConfigError is config.ConfigError
    assert set(stallwatch.__all__) >= {"open_run", "ProfilerConfig", "ProfilingRange", "ConfigError"}
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        stallwatch.Nope  # noqa: B018
