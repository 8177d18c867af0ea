"""`stallwatch info` text for a real small run: nodes, snapshots, metrics, size, damaged files."""

from __future__ import annotations

import re

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.info import _compact, render_info
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run
from stallwatch.units import format_value
from tests.run_builder import T0, make_run, node_record, write_node_json


def _section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(title) + 1
    out = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        out.append(line.strip())
    return out


def test_render_info_of_a_small_run(tmp_path):
    """The text names the run, each node with its snapshots, every metric with its devices, and the size."""
    root = tmp_path / "20261122-060000-abc123"
    make_run(root, seconds=30, offsets_s=(0, 3))
    for rank in ("0", "1"):
        p = root / "framework" / "algo-1" / rank / "steps.parquet"
        p.parent.mkdir(parents=True)
        p.write_bytes(b"")
    text = render_info(RunAnalysis(open_run(str(root))))
    lines = text.splitlines()
    assert lines[0] == f"run        {root}"
    assert lines[1] == "run id     20261122-060000-abc123"
    assert lines[2] == "command    python train.py --epochs 1"
    assert lines[3] == ("span       2025-11-22 05:40:00 UTC → 2025-11-22 05:40:32 UTC (32.5 s)")

    files = [p for p in root.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    assert lines[4] == f"size       {format_value(size, 'B')} in {len(files)} files"
    # run.json + 2 node records, 3 segments per node, a system rollup per node, 2 framework files
    assert len(files) == 3 + 6 + 2 + 2

    rows = {line.split()[0]: line.split() for line in lines if line.startswith("algo-")}
    assert rows["algo-1"][:4] == ["algo-1", "2", "0", "30"]
    assert rows["algo-1"][-3:] == ["finished", "0", "0,1"]
    assert rows["algo-2"][:4] == ["algo-2", "2", "0", "30"]
    assert "2025-11-22 05:40:03 UTC" in " ".join(rows["algo-2"])  # algo-2's first snapshot
    assert rows["algo-2"][-1] == "-"

    metrics = _section(text, "metrics of algo-1:")
    assert metrics == [
        "cpu_iowait           cpu",
        "cpu_util             cpu, proc, cpu0, cpu1",
        "gpu_util             gpu0",
        "mem_used_bytes       memory",
        "mem_util             memory",
        "workers_alive        proc",
    ]
    assert "metrics of algo-2:" in lines
    assert "unreadable" not in text


def test_render_info_reports_unreadable_files_even_when_none_is_readable(tmp_path):
    """A node whose every file is damaged still shows how many were skipped."""
    root = tmp_path / "run"
    make_run(root, nodes=("a",), seconds=12)
    for seg in (root / "system" / "a").iterdir():
        seg.write_bytes(b"garbage")
    text = render_info(RunAnalysis(open_run(str(root))))
    assert "metrics of a:" in text
    assert "(2 unreadable file(s) skipped)" in text
    assert re.search(r"^a\s+2\s+0\s+0\s+-\s+-\s+0 B\s+finished", text, re.M)  # nothing readable stored


def test_render_info_of_a_run_without_data(tmp_path):
    """A run that only has its node record shows the node, zero snapshots and dashes, not an error."""
    root = tmp_path / "run"
    write_node_json(RunLocation(str(root)), node_record("solo", T0, None, samples=0, finished=False))
    text = render_info(RunAnalysis(open_run(str(root))))
    assert "run id     -" in text and "command    -" in text
    assert re.search(r"^solo\s+2\s+0\s+0\s+-\s+-\s+-\s+running\s+-\s+-$", text, re.M)
    assert "metrics of" not in text


def test_compact_device_lists():
    """Long contiguous runs of numbered devices are shortened; gaps and short lists are spelled out."""
    assert _compact([f"cpu{i}" for i in range(16)]) == "cpu0…cpu15"
    assert _compact(["cpu", "cpu1", "cpu0"]) == "cpu, cpu0, cpu1"
    assert _compact(["gpu0", "gpu2", "gpu5"]) == "gpu0, gpu2, gpu5"
    assert _compact(["memory"]) == "memory"
