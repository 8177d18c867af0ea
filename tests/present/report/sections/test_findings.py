"""The findings section lists each Python-profiling window's top functions (own time, cumulative, calls) from the
per-function summary stored with it — never by unmarshalling the raw profile, which is untrusted data."""

from __future__ import annotations

import json
from pathlib import Path

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.report import html
from stallwatch.present.report.model import NotApplicable, Table
from stallwatch.present.report.sections import findings
from stallwatch.store import layout, profiles_codec
from stallwatch.store.location import RunLocation
from tests.present.report._full_runs import full_run

S = 1_000_000
HOSTILE = "<script>alert(1)</script>"


def _python_window(root: Path, *, rows: list[dict] | None, start_us: int, pstats: bytes = b"") -> str:
    """A complete Python-profiling window as the sampler stores it: the raw profile, its functions.parquet (unless
    `rows` is None: a summary that failed), window.json."""
    loc = RunLocation(str(root))
    window = layout.window_name("python", start_us)
    d = layout.trace_window_dir("algo-1", 0, window)
    files = [layout.PSTATS]
    loc.write_atomic(f"{d}/{layout.PSTATS}", pstats or b"\x00not marshal data: never read by the report")
    if rows is not None:
        loc.write_atomic(f"{d}/{layout.FUNCTIONS_PARQUET}", profiles_codec.encode_functions(rows))
        files.append(layout.FUNCTIONS_PARQUET)
    record = {"layer": "python", "start_us": start_us, "end_us": start_us + 2 * S, "node": "algo-1", "rank": 0,
              "window": window, "files": files, "summary_error": None if rows is not None else "making it failed",
              "first_step": 10, "last_step": 12, "range": "10:3", "mode": "TRAIN", "profiler": "cprofile",  # as the collector writes it
              "status": "complete"}
    loc.write_atomic(f"{d}/{layout.WINDOW_JSON}", json.dumps(record).encode())
    return d


def _rows(n: int) -> list[dict]:
    rows = [{"function": f"fn{i}", "file": f"/home/me/project/pkg/mod{i}.py", "line": i + 1, "calls": 10 * i,
             "self_us": 1000.0 * i, "total_us": 5000.0 * i} for i in range(n)]
    rows.append({"function": "<built-in method time.sleep>", "file": "~", "line": 0, "calls": 1, "self_us": 20_500.0,
                 "total_us": 20_500.0})
    return rows


def test_a_python_windows_top_functions_are_listed(tmp_path: Path):
    root = full_run(tmp_path / "run", gpus=0).root
    path = _python_window(root, rows=_rows(30), start_us=1_700_000_100 * S)
    _python_window(root, rows=None, start_us=1_700_000_200 * S)
    (section,) = findings.build(RunAnalysis(str(root)))
    tables = [b for b in section.blocks if isinstance(b, Table) and b.caption.startswith("cProfile")]
    (table,) = tables
    assert table.columns == ["function", "where", "calls", "own (ms)", "cumulative (ms)"]
    assert len(table.rows) == 15 and "top 15 of 31 functions" in table.caption and path in table.caption
    assert table.rows[0] == ["fn29", "pkg/mod29.py:30", 290, 29.0, 145.0]  # most own time first
    assert [r[3] for r in table.rows] == sorted((r[3] for r in table.rows), reverse=True)
    assert "steps 10–12" in table.caption
    assert ["<built-in method time.sleep>", "built-in", 1, 20.5, 20.5] in table.rows
    (failed,) = [b for b in section.blocks if isinstance(b, NotApplicable)]
    assert "no function summary was stored with it (making it failed)" in failed.reason


def test_hostile_function_names_are_escaped(tmp_path: Path):
    root = full_run(tmp_path / "run", gpus=0).root
    rows = [{"function": HOSTILE, "file": f"/a/b/{HOSTILE}.py", "line": 1, "calls": 1, "self_us": 9e6,
             "total_us": 9e6}]
    _python_window(root, rows=rows, start_us=1_700_000_100 * S)
    (section,) = findings.build(RunAnalysis(str(root)))
    page = html.render([section], title="t")
    assert HOSTILE not in page and html.escape(HOSTILE) in page
