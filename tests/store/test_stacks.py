"""Stack dumps in the run (stacks/<node>/<rank>/<request>-<pid>.json) are untrusted data: a reader takes the
well-formed ones and skips, saying so once, any file that is malformed, too big, or names another node or rank
than its path."""

from __future__ import annotations

import json
import logging

from stallwatch.store.location import RunLocation
from stallwatch.store.stacks import MAX_FILE_BYTES, dump_path, read_dumps, write_dump

GOOD = {"request": 3, "at_us": 1_764_000_000_000_000, "threads_left_out": 0,
        "threads": [{"name": "MainThread", "main": True, "daemon": False, "frames_left_out": 0,
                     "frames": [{"file": "/job/train.py", "line": 31, "function": "<module>", "code": "time.sleep(9)"}]}]}


def test_what_the_sampler_writes_reads_back_and_bad_files_are_skipped(tmp_path, caplog):
    loc = RunLocation(str(tmp_path))
    rel = write_dump(loc, "vm", {"rank": 1, "pid": 77}, GOOD)
    assert rel == dump_path("vm", 1, 3, 77) == "stacks/vm/1/000003-77.json"
    bad = {"stacks/vm/0/000001-5.json": b"{not json",
           "stacks/vm/0/000002-5.json": json.dumps({**GOOD, "threads": "all of them"}).encode(),
           "stacks/vm/0/000003-5.json": json.dumps({**GOOD, "node": "other", "rank": 0, "pid": 5}).encode(),
           "stacks/vm/0/000004-5.json": b" " * (MAX_FILE_BYTES + 1),
           "stacks/vm/x/000001-5.json": json.dumps({**GOOD, "node": "vm", "rank": 0, "pid": 5}).encode()}
    for path, data in bad.items():
        loc.write_atomic(path, data)
    with caplog.at_level(logging.WARNING, logger="stallwatch"):
        dumps = read_dumps(loc)
    (dump,) = dumps
    assert (dump.node, dump.rank, dump.pid, dump.request, dump.path) == ("vm", 1, 77, 3, rel)
    assert dump.main is not None and dump.main.frames[0].code == "time.sleep(9)"
    said = caplog.text
    for path in list(bad)[:4]:
        assert path in said, path


def test_a_malformed_dump_from_a_process_is_refused_before_anything_is_written(tmp_path):
    loc = RunLocation(str(tmp_path))
    for dump in ({**GOOD, "request": "3"}, {**GOOD, "threads": [{"frames": "x"}]}, []):
        try:
            write_dump(loc, "vm", {"rank": 0, "pid": 1}, dump)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            continue
        raise AssertionError(f"accepted {dump!r}")
    assert not (tmp_path / "stacks").exists()
