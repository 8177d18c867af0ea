"""The sampler's journal: what it received and had not stored yet is read back by the next sampler; a record
cut short by the kill, and garbage, are skipped; a cleared journal replays nothing but the senders' marks."""

from __future__ import annotations

from stallwatch.collect.journal import EventJournal, replay
from stallwatch.records import FrameworkEvent


def _events(first: int, n: int) -> list[FrameworkEvent]:
    return [FrameworkEvent("step", "train_step", 1000 * i, 1000 * i + 900, "TRAIN", i, 42, "") for i in
            range(first, first + n)]


def test_replay_returns_what_was_journaled_and_skips_a_torn_tail(tmp_path):
    path = str(tmp_path / "events.journal")
    j = EventJournal(path)
    assert j.append([(0, _events(0, 3))], {7: 2})
    assert j.append([(5, _events(3, 2))], {7: 3, 9: 1})
    j.close(remove=False)
    with open(path, "ab") as f:
        f.write(b"\x40\x00\x00\x00partial")  # the kill hit in the middle of a record
    got = replay(path)
    assert got.batches == [(0, _events(0, 3)), (5, _events(3, 2))]
    assert got.marks == {7: 3, 9: 1}


def test_a_cleared_journal_replays_no_events_but_keeps_the_marks_and_garbage_is_refused(tmp_path):
    path = str(tmp_path / "events.journal")
    j = EventJournal(path)
    j.append([(0, _events(0, 3))], {7: 4})
    j.clear({7: 4, 8: 1})
    j.append([(1, _events(3, 1))], {7: 5})
    j.close(remove=False)
    got = replay(path)
    assert got.batches == [(1, _events(3, 1))] and got.marks == {7: 5, 8: 1}
    (tmp_path / "bad").write_bytes(b"\x05\x00\x00\x00hello")
    assert replay(str(tmp_path / "bad")).batches == [] and replay(str(tmp_path / "missing")).batches == []


def test_a_record_cut_short_by_a_full_disk_is_cut_off_and_the_later_records_still_replay(tmp_path, monkeypatch):
    """os.write may write part of a record (ENOSPC midway): that is a failed append, and the piece is cut off
    again, or every record after it would be unreadable."""
    import os

    path = str(tmp_path / "events.journal")
    j = EventJournal(path)
    assert j.append([(0, _events(0, 2))], {7: 1})
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:10]))
    assert not j.append([(0, _events(2, 2))], {7: 2})
    monkeypatch.setattr(os, "write", real_write)
    assert j.append([(0, _events(4, 2))], {7: 3})
    j.close(remove=False)
    got = replay(path)
    assert got.batches == [(0, _events(0, 2)), (0, _events(4, 2))] and got.marks == {7: 3}
    assert os.path.getsize(path) == j.bytes
