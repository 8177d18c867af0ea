"""Node comparison: absent for single-node runs; per-node medians from the rules; the planted odd node named."""

from __future__ import annotations

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.report.model import GOOD, WARN, Chart, Table, Verdict
from stallwatch.present.report.sections import nodes
from stallwatch.store.reader import open_run
from tests.analyze.rules._gen import make_node
from tests.present.generated_run import training_run, write_run


def _build(path) -> list:
    return nodes.build(RunAnalysis(open_run(str(path))))


def _rows(sec) -> dict[str, dict[str, object]]:
    table = next(b for b in sec.blocks if isinstance(b, Table))
    return {row[0]: dict(zip(table.columns, row)) for row in table.rows}


def test_single_node_has_no_section(tmp_path):
    training_run(tmp_path / "run", nodes=("algo-1",))
    assert _build(tmp_path / "run") == []


def test_odd_gpu_node_named(tmp_path):
    frames = [make_node("algo-1", 600, 4, 2, seed=1), make_node("algo-2", 600, 4, 2, seed=2),
              make_node("algo-3", 600, 4, 2, seed=3, gpu_util=40.0)]
    training_run(tmp_path / "run", frames=frames)
    (sec,) = _build(tmp_path / "run")
    assert sec.id == "nodes" and sec.title == "Node comparison"
    rows = _rows(sec)
    assert rows["algo-3"]["GPU median (%)"] == pytest.approx(40, abs=1)
    assert rows["algo-1"]["GPU median (%)"] == pytest.approx(80, abs=1)
    assert rows["algo-1"]["Training step median (ms)"] == pytest.approx(100, abs=1)
    assert rows["algo-1"]["Stands out"] == "-" and rows["algo-2"]["Stands out"] == "-"
    assert rows["algo-3"]["Stands out"].startswith("GPU median 40")
    verdicts = [b for b in sec.blocks if isinstance(b, Verdict)]
    assert len(verdicts) == 1 and verdicts[0].level == WARN and "Node algo-3" in verdicts[0].text
    assert any(isinstance(b, Chart) for b in sec.blocks)


def test_slow_steps_on_one_node(tmp_path):
    from tests.analyze.rules._fw_gen import FwGen
    from tests.analyze.rules._gen import START_US

    frames = [make_node(f"algo-{k}", 600, 4, 2, seed=k) for k in (1, 2, 3, 4)]
    fw = FwGen()
    for k, frame in enumerate(frames):
        fw.steps(node=frame.node, n=500, start_us=START_US + 10_000_000, step_us=130_000 if k == 1 else 100_000)
    write_run(tmp_path / "run", frames, fw.table())
    (sec,) = _build(tmp_path / "run")
    rows = _rows(sec)
    assert rows["algo-2"]["Training step median (ms)"] == pytest.approx(130, abs=1)
    assert "Training step median 130 ms against 100 ms (median of all nodes)" in rows["algo-2"]["Stands out"]
    assert [r["Stands out"] for n, r in rows.items() if n != "algo-2"] == ["-", "-", "-"]


def test_alike_nodes_are_good(tmp_path):
    training_run(tmp_path / "run", nodes=("algo-1", "algo-2", "algo-3"), n=600)
    (sec,) = _build(tmp_path / "run")
    (verdict,) = [b for b in sec.blocks if isinstance(b, Verdict)]
    assert verdict.level == GOOD


def test_two_nodes_that_differ_are_both_named(tmp_path):
    frames = [make_node("algo-1", 600, 4, 2, seed=1), make_node("algo-2", 600, 4, 2, seed=2, cpu_util=70.0)]
    write_run(tmp_path / "run", frames)
    (sec,) = _build(tmp_path / "run")
    rows = _rows(sec)
    assert "on the other node" in rows["algo-1"]["Stands out"] and "on the other node" in rows["algo-2"]["Stands out"]
    assert "Training step median (ms)" not in next(b for b in sec.blocks if isinstance(b, Table)).columns
