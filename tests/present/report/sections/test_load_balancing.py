"""Workload balancing on generated runs: each GPU's histogram is the share of its stored snapshots per 2 % bin,
the distances are the rule's, the planted imbalance (algo-1's gpu1 at 30 % from snapshot 200) is named, and a
node with one GPU says there is nothing to balance."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.present.report.model import INFO, WARN, Chart, NotApplicable, Table, Verdict
from stallwatch.present.report.sections import load_balancing

from ....analyze.rules._fw_gen import T0
from ....analyze.rules._gen import make_node
from . import _runs
from ._runs import PATIENCE, blocks_of, built, glyph_sources, rows_by, table


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return built("gpu", tmp_path_factory)


def test_each_histogram_is_the_share_of_snapshots_per_bin(gpu):
    (chart,) = [c for c in blocks_of(load_balancing.build(gpu), Chart) if "node algo-1" in c.caption]
    stored = gpu.run.system_wide("algo-1")
    for src in glyph_sources(chart.model, "Quad"):
        name = src.data["series"][0]
        v = stored[f"{name}/gpu_util"].to_numpy(zero_copy_only=False).astype(np.float64)[PATIENCE:]
        counts, edges = np.histogram(v, bins=50, range=(0, 100))
        keep = counts > 0
        assert list(src.data["left"]) == pytest.approx(edges[:-1][keep])
        assert list(src.data["top"]) == pytest.approx(counts[keep] / counts.sum())


def test_the_distances_are_the_rules_and_the_planted_imbalance_is_named(gpu):
    sections = load_balancing.build(gpu)
    detail = gpu.rule("LoadBalancing").details["algo-1"]
    rows = rows_by(table(sections, "Distances between the GPUs' workloads on node algo-1"), "GPU")
    assert rows[("gpu0",)]["gpu1"] == rows[("gpu1",)]["gpu0"] == detail["distances"]["gpu0"]["gpu1"] > 0.2
    assert rows[("gpu0",)]["gpu0"] == 0.0
    assert rows[("gpu1",)]["Mean utilization %"] == detail["mean_utilization"]["gpu1"] < 50
    warnings = [v for v in blocks_of(sections, Verdict) if v.level == WARN]
    assert any("node algo-1" in v.text and "gpu0 and gpu1" in v.text for v in warnings)
    assert sections[0].blocks[-1].level == WARN


def test_one_gpu_means_nothing_to_balance(tmp_path_factory):
    root = _runs.write_run(tmp_path_factory.mktemp("one-gpu") / "run", [make_node("solo", 120, gpus=1, start_us=T0)])
    sections = load_balancing.build(_runs.context(root))
    notes = [v for v in blocks_of(sections, Verdict) if v.level == INFO]
    assert [v.text for v in notes] == ["Node solo used one GPU only, so there is no workload to balance."]
    assert not blocks_of(sections, Table)  # no pairs, no distances
    assert len(blocks_of(sections, Chart)) == 1  # its one histogram


def test_a_cpu_only_run_says_balancing_does_not_apply(tmp_path_factory):
    (sec,) = load_balancing.build(built("cpu_only", tmp_path_factory))
    assert isinstance(sec.blocks[0], NotApplicable) and sec.blocks[0].reason.startswith("No GPU on this run")
