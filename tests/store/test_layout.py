"""The run directory's names: chunk names, their parsing, and which chunks hold live data."""

from __future__ import annotations

import random
import re
from datetime import datetime, timezone

from stallwatch.store import layout
from stallwatch.store.layout import PART, SEGMENT, Chunk, chunk_name, live_chunks, parse_chunk


def _chunk(node: str, kind: str, start: int, end: int) -> Chunk:
    c = parse_chunk(f"system/{node}/{chunk_name(kind, start, end)}", 10)
    assert c is not None
    return c


def test_chunk_names_sort_in_time_order():
    """Fixed-width names: sorting names of one kind sorts them by time, across digit-count changes."""
    rnd = random.Random(7)
    starts = sorted({rnd.randrange(0, 10**16) for _ in range(200)} | {0, 9, 10, 99_999, 10**15, 10**16 - 1})
    names = [chunk_name(PART, s, s + 5) for s in starts]
    shuffled = names[:]
    rnd.shuffle(shuffled)
    assert sorted(shuffled) == names
    assert chunk_name(SEGMENT, 1_763_790_000_000_000, 1_763_790_600_000_000) == \
        "seg-1763790000000000-1763790600000000.parquet"


def test_parse_chunk_round_trip():
    """parse_chunk reads node, kind, start, end and size back from a path."""
    name = chunk_name(PART, 1_763_790_000_000_001, 1_763_790_004_500_000)
    c = parse_chunk(f"{layout.system_dir('algo-1')}/{name}", 1234)
    assert c == Chunk(f"system/algo-1/{name}", "algo-1", "part", 1_763_790_000_000_001, 1_763_790_004_500_000, 1234)


def test_parse_chunk_rejects_other_files():
    """Temporary, foreign and too-short paths are not chunks."""
    good = chunk_name(SEGMENT, 1, 2)
    assert parse_chunk(good) is None  # no node directory
    assert parse_chunk(f"node/{good}") is None
    assert parse_chunk(f"system/n/{good}.tmp") is None
    assert parse_chunk(f"system/n/.{good}.abcd1234.tmp") is None
    assert parse_chunk("system/n/part-12-34.parquet") is None  # not fixed width
    assert parse_chunk("system/n/chunk-0000000000000001-0000000000000002.parquet") is None
    assert parse_chunk("system/n/notes.txt") is None


def test_overlaps_is_inclusive_end_of_chunk_and_exclusive_end_of_range():
    """A chunk [s, e] (both sampled) overlaps a query [a, b) iff e >= a and s < b."""
    c = _chunk("n", PART, 100, 200)
    assert c.overlaps(None, None)
    assert c.overlaps(200, None)  # last sample at 200 is inside [200, …)
    assert not c.overlaps(201, None)
    assert not c.overlaps(None, 100)  # [.., 100) excludes the first sample
    assert c.overlaps(None, 101)
    assert c.overlaps(150, 160)
    assert c.overlaps(0, 1000)


def test_live_chunks_drops_parts_covered_by_a_segment_of_the_same_node():
    """After a crash between segment write and part deletion, each sample is listed once."""
    seg = _chunk("a", SEGMENT, 100, 400)
    covered = [_chunk("a", PART, 100, 200), _chunk("a", PART, 201, 300), _chunk("a", PART, 301, 400)]
    later = _chunk("a", PART, 401, 500)  # the next segment's first part, not yet compacted
    live = live_chunks([*covered, later, seg])
    assert live == [seg, later]


def test_live_chunks_keeps_parts_covered_only_by_another_nodes_segment():
    """A segment of node b never hides node a's parts, even over the same time range."""
    seg_b = _chunk("b", SEGMENT, 0, 1000)
    part_a = _chunk("a", PART, 100, 200)
    part_b = _chunk("b", PART, 100, 200)
    assert live_chunks([seg_b, part_a, part_b]) == [part_a, seg_b]


def test_live_chunks_keeps_partly_covered_parts():
    """A part that sticks out of every segment holds samples no segment has; it stays."""
    seg = _chunk("a", SEGMENT, 100, 400)
    straddling = _chunk("a", PART, 350, 450)
    before = _chunk("a", PART, 50, 99)
    assert live_chunks([straddling, seg, before]) == [before, seg, straddling]


def test_live_chunks_sorted_by_node_then_time():
    """The result is ordered by node, then start time, segments before parts at equal start."""
    chunks = [_chunk("b", PART, 5, 6), _chunk("a", PART, 700, 800), _chunk("a", SEGMENT, 0, 600),
              _chunk("b", SEGMENT, 1, 4)]
    out = live_chunks(chunks)
    assert [(c.node, c.kind, c.start_us) for c in out] == [
        ("a", "seg", 0), ("a", "part", 700), ("b", "seg", 1), ("b", "part", 5)]
    assert live_chunks([]) == []


def test_new_run_id_shape():
    """Run ids start with the UTC time and differ between calls."""
    when = datetime(2026, 11, 22, 6, 1, 2, tzinfo=timezone.utc)
    a, b = layout.new_run_id(when), layout.new_run_id(when)
    assert re.fullmatch(r"20261122-060102-[0-9a-f]{6}", a)
    assert a != b or layout.new_run_id(when) != a
    assert layout.node_json("algo-1") == "nodes/algo-1.json"
