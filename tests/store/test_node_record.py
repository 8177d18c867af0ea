"""The node record as the store reads it: typed fields instead of keys, the record on disk unchanged, whether a
node and a run have finished decided in one place, and the exit signal read as the launcher writes it (a name,
docs/format.md; it was read as an integer, so every killed job's record was said to hold a field of the wrong
type and its signal was guessed from the exit code)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from stallwatch.store import layout
from stallwatch.store.location import RunLocation
from stallwatch.store.node_record import NodeRecord, run_finished
from stallwatch.store.reader import open_run
from tests.collect._support import stallwatch
from tests.run_builder import T0, make_run


def _rewrite(run: Path, node: str, **changes) -> dict:
    path = run / layout.node_json(node)
    record = {**json.loads(path.read_text()), **changes}
    record = {k: v for k, v in record.items() if v is not ...}
    RunLocation(str(run)).write_atomic(layout.node_json(node), json.dumps(record).encode())
    return record


def test_the_record_is_typed_and_the_dict_view_is_the_file(tmp_path: Path, caplog):
    make_run(tmp_path / "run", nodes=("algo-1",))
    on_disk = _rewrite(tmp_path / "run", "algo-1", status="finished", exit_code=143, exit_signal="SIGTERM",
                       interrupted=True, gpus=[{"index": 0, "name": "H100", "memory_total_bytes": 80 << 30}],
                       sample_intervals=[{"from_us": T0 + 5_000_000, "sample_interval_ms": 100},
                                         {"from_us": T0, "sample_interval_ms": 500}])
    run = open_run(str(tmp_path / "run"))
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        rec = run.node_records()["algo-1"]
        info = run.info
    assert "wrong type" not in caplog.text  # "SIGTERM" is what docs/format.md says the launcher writes
    assert isinstance(rec, NodeRecord) and rec.name == "algo-1" and rec.finished and run.finished()
    assert (rec.exit_code, rec.exit_signal, rec.interrupted) == (143, "SIGTERM", True)
    assert rec.has_gpus and rec.gpus[0].name == "H100" and rec.gpus[0].memory_total_bytes == 80 << 30
    assert [(c.from_us, c.sample_interval_ms) for c in rec.sample_intervals] == [(T0, 500), (T0 + 5_000_000, 100)]
    assert rec.interval_changes == [(T0, 500.0), (T0 + 5_000_000, 100.0)]
    assert info["nodes"]["algo-1"] == on_disk  # the documented dict: the file's fields, as they are


def test_the_exit_signal_of_older_runs_and_of_jobs_that_exited_by_themselves():
    older = NodeRecord.from_json("a", {"status": "finished", "exit_code": 137})  # no exit_signal field yet
    assert older.exit_signal == "SIGKILL"
    itself = NodeRecord.from_json("a", {"status": "finished", "exit_code": 130, "exit_signal": None})
    assert itself.exit_signal is None  # exit(130) of its own: not a signal
    assert NodeRecord.from_json("a", {"exit_code": 143, "exit_signal": 15}).exit_signal == "SIGTERM"


def test_finished_is_decided_once(tmp_path: Path):
    assert not NodeRecord("a", status="running").finished and not NodeRecord("a", status="starting").finished
    assert NodeRecord("a", status="finished").finished and NodeRecord("a", status="sampler_stopped").finished
    assert not NodeRecord("a").finished  # no status: never seen to finish
    assert not run_finished([]) and not run_finished([NodeRecord("a", status="finished"), NodeRecord("b")])
    make_run(tmp_path / "run", nodes=("algo-1", "algo-2"))
    _rewrite(tmp_path / "run", "algo-2", status="running", end_us=...)
    run = open_run(str(tmp_path / "run"))
    records = run.node_records()
    assert records["algo-1"].finished and not records["algo-2"].finished and not run.finished()
    # the node that never wrote its end ends, for readers, at its last stored sample
    assert records["algo-2"].end_us is None and records["algo-2"].last_us == records["algo-2"].end_us_from_data
    assert records["algo-2"].end_us_from_data == run.info["nodes"]["algo-2"]["end_us_from_data"] is not None


def test_a_job_killed_by_a_signal_reads_back_its_signal(tmp_path: Path):
    """A real `stallwatch run` of a job that SIGTERM ends: its record says so and is read without a warning."""
    job = tmp_path / "job.py"
    job.write_text("import os, signal, time\ntime.sleep(0.5)\nos.kill(os.getpid(), signal.SIGTERM)\n")
    p = stallwatch(tmp_path, "run", "--report", "off", "--out", str(tmp_path / "run"), "--", sys.executable, str(job))
    assert p.returncode == 143, p.stderr
    assert "wrong type" not in p.stderr
    rec = open_run(str(tmp_path / "run")).node_records()
    (only,) = rec.values()
    assert (only.exit_code, only.exit_signal, only.finished) == (143, "SIGTERM", True)
    info = stallwatch(tmp_path, "info", str(tmp_path / "run"))
    assert info.returncode == 0 and "wrong type" not in info.stderr and "SIGTERM" in info.stdout.decode()


def test_ranks_whose_pid_is_unknown_are_kept_without_a_warning(caplog) -> None:
    """An imported run writes `pid: null` for processes its traces do not name: every reader warned and dropped
    all its ranks."""
    import logging

    from stallwatch.store.records_check import NODE_FIELDS, checked

    logging.getLogger("stallwatch").propagate = True
    try:
        with caplog.at_level(logging.WARNING, logger="stallwatch"):
            out = checked({"ranks": [{"rank": 0, "pid": None}, {"rank": 1, "pid": 4242}]}, NODE_FIELDS,
                          "nodes/imported-pid.json")
    finally:
        logging.getLogger("stallwatch").propagate = False
    assert out["ranks"] == [{"rank": 0, "pid": None}, {"rank": 1, "pid": 4242}]
    assert not [r for r in caplog.records if "wrong type" in r.getMessage()]
