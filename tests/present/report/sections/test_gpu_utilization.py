"""GPU utilization on generated runs: box plots whose quantiles are numpy's on the stored snapshots (after the
rule's patience), the planted idle gpu1 of algo-1 named underutilized, a CPU-only run not applicable, and a
rule that failed stated as such."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.judge.feed import read_run
from stallwatch.analyze.rules.low_gpu_utilization import LowGPUUtilization
from stallwatch.analyze.judge.runner import evaluate
from stallwatch.present.report.model import WARN, Chart, NotApplicable, Verdict
from stallwatch.present.report.sections import gpu_utilization

from ._runs import PATIENCE, as_stored, blocks_of, built, glyph_sources, rows_by, table


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return built("gpu", tmp_path_factory)


def test_box_plot_quantiles_are_numpys_on_the_stored_snapshots(gpu):
    charts = {c.caption.split(" (")[0]: c for c in blocks_of(gpu_utilization.build(gpu), Chart)}
    assert set(charts) == {"Utilization per GPU on node algo-1", "Utilization per GPU on node algo-2"}
    for node in ("algo-1", "algo-2"):
        stored = gpu.run.system_wide(node)  # read again, straight from the store
        boxes = {src.data["label"][i]: {k: src.data[k][i] for k in src.data}
                 for src in glyph_sources(charts[f"Utilization per GPU on node {node}"].model, "VBar")[:1]
                 for i in range(len(src.data["label"]))}
        assert set(boxes) == {"gpu0", "gpu1"}
        for gpu_name, box in boxes.items():
            v = stored[f"{gpu_name}/gpu_util"].to_numpy(zero_copy_only=False).astype(np.float64)[PATIENCE:]
            p25, p50, p75, p95 = np.percentile(v, [25, 50, 75, 95])
            iqr = p75 - p25
            assert [box["p25"], box["p50"], box["p75"], box["p95"]] == pytest.approx([p25, p50, p75, p95])
            assert box["upper"] == pytest.approx(min(p75 + 1.5 * iqr, v.max()))
            assert box["lower"] == pytest.approx(max(p25 - 1.5 * iqr, v.min()))
            assert box["max"] == v.max()


def test_the_planted_idle_gpu_is_named_underutilized(gpu):
    sections = gpu_utilization.build(gpu)
    algo1 = rows_by(table(sections, "GPU utilization on node algo-1"), "GPU")
    assert algo1[("gpu1",)]["Verdict"].startswith("underutilized") and algo1[("gpu1",)]["Underutilized"] >= 3
    assert algo1[("gpu1",)]["Median %"] == 30.0
    algo2 = rows_by(table(sections, "GPU utilization on node algo-2"), "GPU")
    assert algo2[("gpu1",)]["Verdict"] == "well used" and algo2[("gpu1",)]["Underutilized"] == 0
    detail = gpu.rule("LowGPUUtilization").details["algo-1"]["gpu1"]
    assert algo1[("gpu1",)]["p95 %"] == detail["gpu_95"] and algo1[("gpu1",)]["p5 %"] == detail["gpu_5"]
    verdict = sections[0].blocks[-1]
    assert isinstance(verdict, Verdict) and verdict.level == WARN
    assert "underutilizing" in verdict.text and "gpu1 on node algo-1" in verdict.text


def test_a_cpu_only_run_says_gpu_utilization_does_not_apply(tmp_path_factory):
    (sec,) = gpu_utilization.build(built("cpu_only", tmp_path_factory))
    (na,) = sec.blocks
    assert isinstance(na, NotApplicable) and na.reason.startswith("No GPU on this run (node cpu-box recorded no GPU")


class _Broken(LowGPUUtilization):
    """The built-in rule, failing on the data (as a broken driver's values might make it)."""

    def update(self, chunk):
        raise RuntimeError("NVML returned garbage")


def test_a_failed_rule_is_stated_not_hidden(gpu):
    (result,) = evaluate([_Broken], [read_run(gpu.run)])
    results = [r for r in gpu.rule_results if r.name != "LowGPUUtilization"] + as_stored([result])
    (sec,) = gpu_utilization.build(RunAnalysis(gpu.run, rule_results=results))
    (na,) = sec.blocks
    assert isinstance(na, NotApplicable)
    assert "could not be analyzed" in na.reason and "NVML returned garbage" in na.reason
