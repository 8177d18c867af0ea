"""A run listed once: the same answers as listing the store each time, until a listed file is found gone."""

from __future__ import annotations

import pytest

from stallwatch.store.listed import ListedLocation
from stallwatch.store.location import RunLocation


@pytest.fixture
def location(tmp_path):
    loc = RunLocation(str(tmp_path))
    for rel in ("run.json", "system/a/seg-1.parquet", "system/a/part-2.arrow", "system/ab/seg-1.parquet",
                "framework/a/0/seg-1.parquet", "framework/a/10/seg-1.parquet"):
        loc.write_atomic(rel, b"x" * len(rel))
    return loc


def _paths(entries):
    return sorted((e.path, e.size) for e in entries)


@pytest.mark.parametrize("folder", ["", "system", "system/a", "system/a/", "framework/a", "nothing", "system/ab"])
@pytest.mark.parametrize("recursive", [True, False])
def test_its_listings_are_the_stores(location, folder, recursive):
    listed = ListedLocation(location, location.list(""))
    assert _paths(listed.list(folder, recursive)) == _paths(location.list(folder, recursive))


def test_a_new_file_is_not_seen_until_a_listed_one_has_gone(location):
    listed = ListedLocation(location, location.list(""))
    parsed = listed.derived("n", lambda: len(listed.list("system")))
    location.write_atomic("system/a/seg-3.parquet", b"new")
    assert len(listed.list("system/a")) == 2 and listed.derived("n", lambda: -1) == parsed  # one state of the run
    location.delete("system/a/part-2.arrow")  # compacted since listed
    with pytest.raises(FileNotFoundError):
        listed.open_input_file("system/a/part-2.arrow")
    assert [e.path for e in listed.list("system/a")] == ["system/a/seg-1.parquet", "system/a/seg-3.parquet"]
    assert listed.derived("n", lambda: len(listed.list("system"))) == 3  # what was derived from it is renewed


def test_reads_and_writes_are_the_stores(location):
    listed = ListedLocation(location, location.list(""))
    listed.write_atomic("rollups/x", b"abc")
    assert location.read("rollups/x") == b"abc" and listed.read("run.json") == b"x" * 8
