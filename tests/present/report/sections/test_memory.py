"""Memory per step on a generated run whose rank 0 keeps 200 KiB a step (rank 1 stays flat): each rank's line
holds the RSS its steps stored, the table has the rule's rate, the capture's line is listed, the verdict names
it; in Chromium the section's chart is drawn and the line is shown as text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stallwatch.present.report import build_report
from stallwatch.present.report.model import WARN, Chart, Verdict
from stallwatch.present.report.sections import memory
from stallwatch.records import GLOBAL, STEP, TRAIN

from ....analyze.rules._fw_gen import MS, T0, FwGen, node_info, snapshots
from ._runs import INTERVAL_US, blocks_of, context, glyph_sources, rows_by, table, write_run

N = 400
SITE = {"file": "/job/train.py", "line": 42, "size_kb": 800.0, "count": 4, "kind": "tensors",
        "traceback": ["/job/train.py:60", "/job/train.py:42", "/site-packages/torch/nn/modules/linear.py:134"]}


@pytest.fixture(scope="module")
def leak(tmp_path_factory):
    gen = FwGen()
    for rank, per_step in ((0, 200), (1, 0)):
        for i in range(N):
            t = T0 + i * 20 * MS
            gen.events("algo-1", rank, STEP, "train_step", TRAIN, i, t, t + 15 * MS,
                       json.dumps({"rss_kb": 2**20 + per_step * i + (i % 7) * 100}))
    gen.events("algo-1", 0, "memory_sites", "tracemalloc", GLOBAL, None, T0 + 5 * 10**6, T0 + 5 * 10**6,
               json.dumps({"steps": [250, 254], "grown_kb": 800.0, "cost_ms": 30.0, "sites": [SITE]}))
    info = {**node_info(), "memory_total_bytes": 16 * 2**30}
    frame = snapshots("algo-1", T0, T0 + N * 20 * MS, interval_us=INTERVAL_US, info=info, cpu__cpu_util=50.0)
    root = write_run(tmp_path_factory.mktemp("memory") / "leak", [frame], gen.table())
    return root, context(root, params={})


def test_each_rank_is_drawn_as_stored_and_the_leak_is_named(leak):
    _, analysis = leak
    sections = memory.build(analysis)
    (chart,) = blocks_of(sections, Chart)
    lines = glyph_sources(chart.model, "Line")
    assert len(lines) == 2
    steps = np.arange(N)
    drawn = sorted((src.data["y"][-1], src) for src in lines)  # rank 1 (flat) ends lower than rank 0
    for (_, src), per_step in zip(drawn, (0, 200)):
        assert src.data["x"].tolist() == steps.tolist()
        expected = (2**20 + per_step * steps + (steps % 7) * 100) / 1024
        assert np.allclose(src.data["y"], expected, atol=1e-3), per_step
    rows = rows_by(table(sections, "Memory against steps"), "Rank")
    rule = analysis.rule("MemoryGrowth").details["series"]["algo-1/0:rss_kb"]
    assert rows[("algo-1/0",)]["MB per 1,000 steps"] == rule["rate_mb_per_1000"] and rows[("algo-1/0",)]["Fires"]
    assert rows[("algo-1/1",)]["Fires"] == ""
    (site,) = table(sections, "Where memory grows on rank algo-1/0").rows
    assert site[:4] == ["job/train.py:42", "tensors kept", 800.0, 4]
    assert site[4] == "modules/linear.py:134 ← job/train.py:42 ← job/train.py:60"
    verdict = blocks_of(sections, Verdict)[-1]
    assert verdict.level == WARN and verdict.text.endswith("allocated at /job/train.py:42.")


def test_the_section_renders_in_chromium(leak, open_report):
    root, _ = leak
    opened = open_report(Path(build_report(str(root))))
    assert opened.errors == []
    section = opened.page.locator("section[id='memory']")
    assert section.locator("div[data-chart] canvas").count() > 0
    assert "job/train.py:42" in section.inner_text() and "tensors kept" in section.inner_text()
