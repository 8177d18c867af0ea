"""The report's Hangs section as a user sees it, in Chromium: a run where rank 1 stopped before the all-reduce rank
0 waits in (its events, snapshots and both ranks' stack dumps written by the store's own writers) shows the verdict
naming rank 1, the stopped ranks with what each was doing, and each one's main-thread stack."""

from __future__ import annotations

from pathlib import Path

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.present.report import build_report
from stallwatch.store.location import RunLocation
from stallwatch.store.stacks import write_dump
from tests.analyze.rules._fw_gen import MS, T0, FwGen, S, write_events
from tests.run_builder import make_run, node_record, write_node_json


def _frames(*rows: tuple[str, int, str, str]) -> list[dict]:
    return [{"file": f, "line": n, "function": fn, "code": code} for f, n, fn, code in rows]


def _dump(frames: list[dict]) -> dict:
    return {"request": 1, "at_us": T0 + 60 * S, "threads_left_out": 0,
            "threads": [{"name": "MainThread", "main": True, "daemon": False, "frames_left_out": 0, "frames": frames}]}


def test_the_hangs_section_names_the_rank_behind_with_its_stack(tmp_path: Path, open_report):
    root = tmp_path / "run"
    make_run(root, nodes=("algo-1",), seconds=120)
    location = RunLocation(str(root))
    record = node_record("algo-1", T0, T0 + 120 * S, samples=120)
    write_node_json(location, {**record, "exit_code": 143, "interrupted": True})  # the job was killed, hung
    gen = FwGen()
    gen.steps(rank=0, n=31, step_us=100 * MS)  # rank 0 finished step 30 and waits in the all-reduce of 31
    gen.steps(rank=1, n=30, step_us=100 * MS)
    write_events(root, gen.table())
    job = "/job/train.py"
    write_dump(location, "algo-1", {"rank": 0, "pid": 1000}, _dump(_frames(
        (job, 32, "<module>", "dist.all_reduce(loss)"),
        ("/py/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce", "work.wait()"))))
    write_dump(location, "algo-1", {"rank": 1, "pid": 1001}, _dump(_frames((job, 31, "<module>", "time.sleep(3600)"))))
    assert (root / "stacks" / "algo-1" / "1" / "000001-1001.json").is_file()

    opened = open_report(Path(build_report(str(root))))
    assert opened.errors == [] and opened.refused == []
    section = opened.page.locator("section[id='hang']")
    assert section.locator("h3").inner_text() == "Hangs"
    text = section.inner_text()
    assert "The job hung: rank 1 never reached all_reduce, where rank 0 waits" in text
    assert "inside all_reduce (called at /job/train.py:32 in <module>)" in text
    assert "stacks/algo-1/1/000001-1001.json" in text and "time.sleep(3600)" in text
    top = RunAnalysis(str(root)).findings.to_json()["findings"][0]  # findings.json's document: ranked first
    assert top["rule"] == "Hang" and top["severity"] == "high" and top["evidence"]["behind"] == ["algo-1/1"]
