"""The live counts file: what the sampler writes is what readers get; a file of a run is untrusted, so a bad field
is left out and a bad file skipped, never an exception."""

from __future__ import annotations

import json
from pathlib import Path

from stallwatch.store import layout
from stallwatch.store.live_status import live_version, read_live, write_live
from stallwatch.store.location import RunLocation


def test_written_counts_read_back_and_change_the_stamp(tmp_path: Path) -> None:
    loc = RunLocation(str(tmp_path))
    doc = {"node": "n1", "written_us": 5, "running": True,
           "ranks": [{"rank": 0, "pid": 7, "steps": {"TRAIN": 3}, "last_step": {"TRAIN": 2}, "first_us": 1,
                      "last_us": 4}],
           "progress": [[2, 1], [4, 3]], "step_us": {"TRAIN": 3}, "phase_us": {"TRAIN": {"forward": 1}},
           "notices": [{"rank": 0, "layer": "detailed", "range": "5:1", "outcome": "past", "message": "m",
                        "at_us": 4}]}
    assert live_version(loc, ["n1"]) == ((),)
    write_live(loc, "n1", doc)
    first = live_version(loc, ["n1"])
    (live,) = read_live(loc, ["n1", "n2"]).values()
    assert live.steps == {"TRAIN": 3} and live.ranks[0].last_step == {"TRAIN": 2} and live.running
    assert live.progress == ((2, 1), (4, 3)) and live.phase_us == {"TRAIN": {"forward": 1}}
    assert live.notices[0].outcome == "past"
    write_live(loc, "n1", {**doc, "written_us": 6})
    assert live_version(loc, ["n1"]) != first


def test_bad_fields_are_left_out_and_a_bad_file_skipped(tmp_path: Path) -> None:
    (tmp_path / layout.LIVE_DIR).mkdir()
    (tmp_path / layout.live_json("n1")).write_text(json.dumps({
        "schema": 1, "written_us": 9, "ranks": [{"rank": "0"}, {"rank": 1, "steps": {"TRAIN": -4, "BOGUS": 3,
                                                                                    "EVAL": True}}],
        "progress": [[1, "x"], [2, 2], "no"], "phase_us": {"X": {}}, "notices": [{"rank": 0}]}))
    (tmp_path / layout.live_json("n3")).write_text(json.dumps({
        "schema": 1, "written_us": 9, "ranks": {"0": 1}, "progress": {"a": 1}, "notices": "x", "phase_us": [],
        "snapshots": {"columns": {"a": 1}, "rows": 3}}))
    (tmp_path / layout.live_json("n2")).write_text("{not json")
    nodes = read_live(RunLocation(str(tmp_path)), ["n1", "n2", "n3"])
    assert list(nodes) == ["n1", "n3"] and nodes["n3"].ranks == () and nodes["n3"].progress == ()
    live = nodes["n1"]
    assert [r.rank for r in live.ranks] == [1] and live.ranks[0].steps == {}
    assert live.progress == ((2, 2),) and live.phase_us == {} and live.notices == ()
