"""What stallwatch cost the training processes (their `overhead` markers) is said where it is a material share
of the loop, once, naming the rank it cost most; a record that does not read is no evidence."""

from __future__ import annotations

import json

import pyarrow as pa

from stallwatch.analyze.overhead import MATERIAL, MIN_WINDOW_NS, HookCost, hook_costs, notes


def _markers(rows):
    return pa.table({"node": [r[0] for r in rows], "rank": [r[1] for r in rows],
                     "args": [r[2] if isinstance(r[2], str) else json.dumps(r[2]) for r in rows]})


def _args(own, window, calls=1000, sender=0):
    return {"own_ns": own, "window_ns": window, "calls": calls, "sender_ns": sender}


def test_the_newest_record_of_each_rank_counts_and_bad_ones_are_skipped():
    costs = hook_costs(_markers([
        ("a", 0, _args(1, 10**9)), ("a", 0, _args(3 * 10**8, 2 * 10**9)),  # cumulative: the longer window is newer
        ("a", 1, "{not json"), ("a", 1, _args("x", 10**9)), ("a", 1, _args(5, 0)), ("a", 1, _args(-5, 10**9)),
        ("b", 0, {"window_ns": 10**9}),
    ]))
    assert costs == [HookCost("a", 0, 3 * 10**8, 2 * 10**9, 1000)]
    assert costs[0].share == 0.15


def test_the_event_threads_cpu_adds_to_the_hooks_share():
    cost = HookCost("a", 0, own_ns=10**8, window_ns=10**9, calls=10, sender_ns=5 * 10**7)
    assert cost.share == (10**8 + 5 * 10**7) / 10**9


def test_a_material_share_is_one_note_naming_the_costliest_rank():
    big = HookCost("n1", 3, own_ns=2 * 10**8, window_ns=10**9, calls=40_000)
    small = HookCost("n0", 0, own_ns=10**6, window_ns=10**9, calls=100)
    [line] = notes([small, big])
    assert line.startswith("stallwatch took at least 20 % of the training process's time on rank 3 on n1 (5.0 µs "
                           "per hook call"), line
    [line] = notes([big, HookCost("n2", 1, own_ns=10**8, window_ns=10**9, calls=1)])
    assert "on 2 of 2 ranks (most: rank 3 on n1)" in line


def test_an_immaterial_share_or_a_short_window_says_nothing():
    assert notes([HookCost("a", 0, own_ns=int(MATERIAL * 10**9) - 1, window_ns=10**9, calls=1)]) == []
    assert notes([HookCost("a", 0, own_ns=MIN_WINDOW_NS // 2, window_ns=MIN_WINDOW_NS - 1, calls=1)]) == []
    assert notes([]) == []
