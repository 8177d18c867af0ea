"""Batch size on generated runs: the box plots hold the total CPU, each GPU and each GPU's memory with numpy's
statistics on the stored snapshots after patience (memory from memory alone), and the windows where the planted
idle GPUs left CPU, GPU and memory all low are counted in the verdict."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.present.report.model import WARN, Chart, NotApplicable, Verdict
from stallwatch.present.report.sections import batch_size

from ._runs import PATIENCE, blocks_of, built, glyph_sources, rows_by, table

SERIES = {"CPU (total)": "cpu/cpu_util", "gpu0": "gpu0/gpu_util", "gpu0 memory": "gpu0/gpu_mem_util",
          "gpu1": "gpu1/gpu_util", "gpu1 memory": "gpu1/gpu_mem_util"}


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return built("gpu", tmp_path_factory)


def test_box_plots_hold_cpu_gpu_and_memory_with_numpys_statistics(gpu):
    sections = batch_size.build(gpu)
    for node in ("algo-1", "algo-2"):
        (chart,) = [c for c in blocks_of(sections, Chart) if f"on node {node}" in c.caption]
        src = glyph_sources(chart.model, "VBar")[0]
        assert list(src.data["label"]) == list(SERIES)
        stored = gpu.run.system_wide(node)
        for i, label in enumerate(src.data["label"]):
            v = stored[SERIES[label]].to_numpy(zero_copy_only=False).astype(np.float64)[PATIENCE:]
            expected = np.percentile(v, [25, 50, 75, 95])
            got = [src.data[k][i] for k in ("p25", "p50", "p75", "p95")]
            assert got == pytest.approx(expected, abs=1e-3), (node, label)  # the rule keeps 4 decimals
        rows = rows_by(table(sections, f"Node {node}:"), "Series")
        assert rows[("gpu1 memory",)]["p95 %"] == gpu.rule("BatchSize").details[node]["gpu1_memory"]["p95"]


def test_the_flagged_windows_are_counted_per_node_and_in_the_verdict(gpu):
    sections = batch_size.build(gpu)
    details = gpu.rule("BatchSize").details
    for node in ("algo-1", "algo-2"):
        flagged, windows = details[node]["violations"], details[node]["windows"]
        assert flagged > 0  # algo-1's gpu1 at 30 %, algo-2's gpu0 at 5 %, with CPU at 30 % and memory at 40 %
        table(sections, f"Node {node}: {flagged} of {windows} windows flagged")
    verdict = sections[0].blocks[-1]
    assert isinstance(verdict, Verdict) and verdict.level == WARN
    assert f"low in {gpu.rule('BatchSize').violations} windows" in verdict.text


def test_a_cpu_only_run_says_batch_size_does_not_apply(tmp_path_factory):
    (sec,) = batch_size.build(built("cpu_only", tmp_path_factory))
    assert isinstance(sec.blocks[0], NotApplicable) and sec.blocks[0].reason.startswith("No GPU on this run")
