"""Dataloading analysis on generated runs: two ranks with num_workers=1 on 4 cores (too few, no pinned memory on
a GPU node) are named with the worker count to try; the loaders' settings are those of their events; the wait
histogram is that of the stored data waits; a well-sized CPU-only job gets a good verdict."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pytest

from stallwatch.analyze.rules.input_bound import InputBoundDetails
from stallwatch.present.report.model import GOOD, WARN, Chart, NotApplicable, Paragraph, Verdict
from stallwatch.present.report.sections import dataloading

from ....analyze.rules import _gen
from ....analyze.rules._fw_gen import T0, FwGen
from ._runs import blocks_of, built, context, glyph_sources, rows_by, table, write_run


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return built("gpu", tmp_path_factory)


def _events(ctx, kind: str):
    fw = ctx.run.framework()
    return fw.filter(pc.equal(fw["kind"].cast("string"), kind))


def test_workers_against_cores_name_the_node_with_too_few(gpu):
    sections = dataloading.build(gpu)
    (row,) = rows_by(table(sections, "Data-loader workers and CPU cores"), "Node").values()
    assert row["Node"] == "algo-2" and row["CPU cores"] == 4 and row["Ranks"] == 2
    assert row["Workers in parallel (median)"] == 2.0 and row["% of cores"] == 50.0 and row["Verdict"] == "too few workers"
    assert row["Data wait (% of step time, worst rank)"] == pytest.approx(30.0, abs=1.5)
    # the figure InputBound judged (the report's top finding quotes it), not a second one computed here
    judged = InputBoundDetails.from_json(gpu.rule("InputBound").details).train_wait_share("algo-2")
    assert row["Data wait (% of step time, worst rank)"] == judged
    verdict = sections[0].blocks[-1]
    assert isinstance(verdict, Verdict) and verdict.level == WARN
    assert "num_workers=2" in verdict.text and "pin_memory=True" in verdict.text


def test_the_loaders_table_holds_their_settings_events(gpu):
    loaders = table(dataloading.build(gpu), "The data loaders and their settings")
    stored = [json.loads(a) for a in _events(gpu, "dataloader")["args"].to_pylist()]
    assert len(loaders.rows) == len(stored) == 2
    for row in rows_by(loaders, "Rank").values():
        assert row["Workers"] == 1 and row["Pin memory"] is False and row["Prefetch"] == 2
        assert row["Batch size"] == stored[0]["batch_size"] and row["Iterators"] == 1


def test_the_wait_histogram_is_that_of_the_stored_waits(gpu):
    sections = dataloading.build(gpu)
    waits = _events(gpu, "data_wait")
    train = waits.filter(pc.equal(waits["mode"].cast("string"), "TRAIN"))
    seconds = (train["end_us"].to_numpy() - train["start_us"].to_numpy()) / 1e6
    (chart,) = [c for c in blocks_of(sections, Chart) if "waited for each batch" in c.caption]
    (bars,) = glyph_sources(chart.model, "Quad")
    counts, edges = np.histogram(seconds, bins=50)
    keep = counts > 0
    assert list(bars.data["top"]) == pytest.approx(counts[keep] / counts.sum())
    assert list(bars.data["left"]) == pytest.approx(edges[:-1][keep])
    text = " ".join(p.text for p in blocks_of(sections, Paragraph))
    assert f"({len(seconds)} waits during training steps)" in text and f"longest {seconds.max():g} s" in text


def test_a_well_sized_cpu_job_is_fine_and_not_told_to_pin_memory(tmp_path_factory):
    sections = dataloading.build(built("slow_start", tmp_path_factory))
    verdicts = blocks_of(sections, Verdict)
    assert [v.level for v in verdicts] == [GOOD]  # 4 workers on 4 cores; no GPU, so no pin_memory advice
    assert "pin" not in " ".join(v.text for v in verdicts)


def test_without_framework_data_it_does_not_apply(tmp_path_factory):
    (sec,) = dataloading.build(built("cpu_only", tmp_path_factory))
    assert isinstance(sec.blocks[0], NotApplicable) and "stallwatch run" in sec.blocks[0].reason


def test_the_section_does_not_read_as_the_opposite_of_the_starved_loops_finding(tmp_path):
    """0.4 ms steps waiting 0.12 ms for each in-memory batch: InputBound fires (index the tensors in batches), the
    Dataloader rule does not (batches faster than a worker's hand-over): the section says both, not "not a
    bottleneck" alone."""
    gen = FwGen()
    gen.dataloader(node="vm", at_us=T0, key=1, created_at="/job/tight.py:8", name="TensorDataset", num_workers=0)
    _, ends = gen.steps(node="vm", n=3000, start_us=T0 + 1000, step_us=400, gap_us=0, data_wait_us=120,
                        jitter_us=0, loader=1)
    frame = _gen.make_node("vm", 20, cores=4, gpus=0, seed=5, start_us=T0)
    ctx = context(write_run(tmp_path / "tight", [frame], gen.table(), end_us={"vm": int(ends[-1]) + 1000}))
    verdicts = [v for v in blocks_of(dataloading.build(ctx), Verdict)]
    assert any("0.12 ms" in v.text for v in verdicts), [v.text for v in verdicts]
    (starved,) = [v for v in verdicts if v.text.startswith("Yet the InputBound rule found")]
    assert starved.level == WARN and "BatchSampler" in starved.text
