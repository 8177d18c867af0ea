"""GPU memory on generated runs: the planted 12-point rise of algo-2's gpu1 appears with the rule's largest
rise and time, the box plots hold numpy's statistics on the stored memory utilization of the compared windows,
and a CPU-only run is not applicable."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.present.report.model import WARN, Chart, NotApplicable
from stallwatch.present.report.sections import gpu_memory
from stallwatch.present.report.sections._loop import when

from ._runs import N_SNAPSHOTS, PARAMS, PATIENCE, blocks_of, built, glyph_sources, rows_by, table


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return built("gpu", tmp_path_factory)


def test_the_planted_rise_is_shown_with_the_rules_numbers(gpu):
    sections = gpu_memory.build(gpu)
    detail = gpu.rule("GPUMemoryIncrease").details["algo-2"]["gpu1"]
    rows = rows_by(table(sections, "GPU memory utilization on node algo-2"), "GPU")
    rise = rows[("gpu1",)]
    assert rise["Rises"] == 1 and rise["Largest rise [points]"] == detail["increase"] > 5
    assert rise["Last rise"] == when(detail["last_timestamp"])
    assert rows[("gpu0",)]["Rises"] == 0 and rows[("gpu0",)]["Last rise"] == ""
    verdict = sections[0].blocks[-1]
    assert verdict.level == WARN and "1 rise of more than 5 points" in verdict.text


def test_box_plots_hold_numpys_statistics_of_the_compared_windows(gpu):
    window = PARAMS["GPUMemoryIncrease"]["window"]
    compared = PATIENCE + (N_SNAPSHOTS - PATIENCE) // window * window  # complete windows only
    for node in ("algo-1", "algo-2"):
        (chart,) = [c for c in blocks_of(gpu_memory.build(gpu), Chart) if f"on node {node}" in c.caption]
        src = glyph_sources(chart.model, "VBar")[0]
        stored = gpu.run.system_wide(node)
        for i, name in enumerate(src.data["label"]):
            v = stored[f"{name}/gpu_mem_util"].to_numpy(zero_copy_only=False).astype(np.float64)[PATIENCE:compared]
            got = [src.data[k][i] for k in ("p25", "p50", "p75", "p95")]
            assert got == pytest.approx(np.percentile(v, [25, 50, 75, 95]), abs=1e-3), (node, name)


def test_a_cpu_only_run_says_gpu_memory_does_not_apply(tmp_path_factory):
    (sec,) = gpu_memory.build(built("cpu_only", tmp_path_factory))
    assert isinstance(sec.blocks[0], NotApplicable) and sec.blocks[0].reason.startswith("No GPU on this run")
