"""The run's small JSON files through the store: the configuration (validated both ways), rule results (names
that cannot leave rules/, files that are not objects or too large skipped with a line), findings and the
report (atomically, local or remote path returned)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from stallwatch.config import ConfigError, ProfilerConfig
from stallwatch.store import run_files
from stallwatch.store.location import RunLocation


@pytest.fixture
def loc(tmp_path: Path) -> RunLocation:
    return RunLocation(str(tmp_path / "run"))


def test_config_round_trip_and_clear_errors(loc: RunLocation):
    with pytest.raises(FileNotFoundError):
        run_files.read_config(loc)
    assert run_files.config_or_default(loc) == ProfilerConfig()
    run_files.write_config(loc, ProfilerConfig(sample_interval_ms=200, custom_rules=("x.py:Y",)))
    assert run_files.read_config(loc).sample_interval_ms == 200
    loc.write_atomic("config.json", b'{"sample_interval_ms": "fast"}')
    with pytest.raises(ConfigError, match="sample_interval_ms"):
        run_files.read_config(loc)
    loc.write_atomic("config.json", b"[" * 100_000)
    with pytest.raises(ConfigError, match="too deeply"):
        run_files.read_config(loc)
    assert run_files.config_or_default(loc) == ProfilerConfig()


def test_rule_results_written_and_read_back(loc: RunLocation):
    rel = run_files.write_rule_result(loc, "StepOutlier", {"RuleName": "StepOutlier", "Details": {"x": np.int64(3)}})
    assert rel == "rules/StepOutlier.json"
    assert run_files.read_rule_results(loc) == {"StepOutlier": {"RuleName": "StepOutlier", "Details": {"x": 3}}}


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "", "x" * 200])
def test_a_rule_name_cannot_leave_the_rules_folder(loc: RunLocation, name: str):
    with pytest.raises(ValueError, match="cannot name a file"):
        run_files.write_rule_result(loc, name, {})


def test_unusable_result_files_are_skipped_with_one_line(loc: RunLocation, caplog, monkeypatch):
    run_files.write_rule_result(loc, "Good", {"RuleName": "Good"})
    loc.write_atomic("rules/List.json", b"[1, 2]")
    loc.write_atomic("rules/Broken.json", b"{not json")
    loc.write_atomic("rules/Deep.json", b"[" * 100_000 + b"]" * 100_000)
    monkeypatch.setattr(run_files, "MAX_JSON_BYTES", 50)
    loc.write_atomic("rules/Big.json", json.dumps({"RuleName": "Big", "pad": "x" * 100}).encode())
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        assert run_files.read_rule_results(loc) == {"Good": {"RuleName": "Good"}}
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "List.json" in said and "Broken.json" in said and "Big.json" in said


def test_findings_and_report(loc: RunLocation, tmp_path: Path):
    assert run_files.read_findings(loc) is None
    run_files.write_findings(loc, {"verdict": "Healthy"})
    assert run_files.read_findings(loc) == {"verdict": "Healthy"}
    assert run_files.write_report(loc, b"<html></html>") == str(tmp_path / "run" / "report.html")
    out = run_files.write_file_atomic(tmp_path / "elsewhere" / "r.html", b"<html></html>")
    assert Path(out).read_bytes() == b"<html></html>"
