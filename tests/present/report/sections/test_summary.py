"""Section 1, Training job summary: the job's span, and how it splits at the first step's start and the last
step's end, on generated runs where both are planted."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.report.model import GOOD, INFO, WARN, Chart, NotApplicable, Table, Verdict
from stallwatch.present.report.sections import summary
from stallwatch.store.reader import open_run
from stallwatch.timeutil import format_us

from ....analyze.rules._gen import INTERVAL_US, START_US
from .._full_runs import LOOP_START_US, SNAPSHOTS, full_run


def _build(root: Path):
    (section,) = summary.build(RunAnalysis(open_run(str(root))))
    assert (section.id, section.title) == ("summary", "Training job summary")
    return section


def _rows(section) -> dict[str, str]:
    table = next(b for b in section.blocks if isinstance(b, Table) and b.columns == ["", "Job statistics"])
    return dict(table.rows)


def test_the_loop_is_first_step_start_to_last_step_end(tmp_path: Path):
    planted = full_run(tmp_path / "run", gpus=1)
    steps = [e for e in open_run(str(planted.root)).framework().to_pylist() if e["kind"] == "step"]
    last_end = max(e["end_us"] for e in steps)
    job_end = START_US + SNAPSHOTS * INTERVAL_US  # the last snapshot's time + one interval (the node's end)
    section = _build(planted.root)
    rows = _rows(section)
    assert rows["Start time"] == format_us(START_US) and rows["End time"] == format_us(job_end)
    assert rows["Training loop start"] == format_us(LOOP_START_US) and rows["Training loop end"] == format_us(last_end)
    assert rows["Initialization time"] == "1m 00s"  # planted: the first minute
    per_mode = {m: sum(1 for e in steps if e["mode"] == m) for m in ("TRAIN", "EVAL", "GLOBAL")}
    assert rows["Steps (all ranks)"] == ", ".join(f"{n:,} {m}" for m, n in per_mode.items() if n)
    total = (job_end - START_US) / 1e6
    assert rows["Initialization"] == f"{100 * 60 / total:.1f} %"
    assert rows["Training loop"] == f"{100 * (last_end - LOOP_START_US) / 1e6 / total:.1f} %"
    assert rows["Finalization"] == f"{100 * (job_end - last_end) / 1e6 / total:.1f} %"
    (pie,) = [b for b in section.blocks if isinstance(b, Chart)]
    wedges = {s.label: s.value for s in pie.model.slices}
    assert wedges == pytest.approx({"Initialization": 60.0, "Training loop": (last_end - LOOP_START_US) / 1e6,
                                    "Finalization": (job_end - last_end) / 1e6})
    assert [b for b in section.blocks if isinstance(b, Verdict)][0].level == GOOD  # the loop took 58 %


def test_without_framework_data_the_span_only_and_why(tmp_path: Path):
    planted = full_run(tmp_path / "run", gpus=0, framework=False)
    section = _build(planted.root)
    rows = _rows(section)
    assert "Training loop start" not in rows and rows["Job duration"] == "10m 00s"
    (na,) = [b for b in section.blocks if isinstance(b, NotApplicable)]
    assert "No step information was profiled" in na.reason
    assert not [b for b in section.blocks if isinstance(b, Chart)]


def test_several_nodes_get_a_row_each(tmp_path: Path):
    planted = full_run(tmp_path / "run", nodes=("algo-1", "algo-2", "algo-3"), gpus=0)
    section = _build(planted.root)
    per_node = next(b for b in section.blocks if isinstance(b, Table) and b.caption == "Per node")
    assert [r[0] for r in per_node.rows] == ["algo-1", "algo-2", "algo-3"]
    assert all(r[4] == format_us(LOOP_START_US) and r[6] == "1m 00s" for r in per_node.rows)


@pytest.mark.parametrize("parts, level, words", [
    ({"Initialization": 300.0, "Training loop": 100.0, "Finalization": 10.0}, WARN, "longer than the training loop"),
    ({"Initialization": 10.0, "Training loop": 100.0, "Finalization": 10.0}, INFO, "took 83 %"),
    ({"Initialization": 40.0, "Training loop": 50.0, "Finalization": 60.0}, INFO, "took only 33 %"),
])
def test_verdict(parts, level, words):
    v = summary.verdict(parts, sum(parts.values()))
    assert v.level == level and words in v.text
