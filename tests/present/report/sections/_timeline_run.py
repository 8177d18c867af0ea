"""The generated run the timeline's tests share (the section's and the analysis's)."""

from __future__ import annotations

import pytest

from tests.analyze.rules._gen import make_node, plant_cpu_bottleneck
from tests.present.generated_run import S, training_run

BOTTLENECK = (300, 1500)  # snapshots of algo-1 where gpu1 idles while cpu3 is saturated (over the patience)


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory):
    """Two nodes with 4 GPUs; algo-1 has a CPU bottleneck and a one-snapshot GPU-memory spike; two ranks each
    with slow steps 100 and 2000."""
    a = plant_cpu_bottleneck(make_node("algo-1", 2400, 8, 4, seed=1), *BOTTLENECK, gpu=1, core=3)
    a.columns["gpu2/gpu_mem_util"][2222] = 99.0
    b = make_node("algo-2", 2400, 8, 4, seed=2)
    for node in (a, b):  # the job's own CPU, as the sampler records it: a share of the host-wide figure
        node.columns["proc/cpu_util"] = node.columns["cpu/cpu_util"] * 0.8
    return training_run(tmp_path_factory.mktemp("tl") / "run", frames=[a, b], ranks=2,
                        slow={100: 2 * S, 2000: 3 * S})
