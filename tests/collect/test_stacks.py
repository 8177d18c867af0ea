"""A process's stacks as its sender thread reads them when asked: every thread but stallwatch's own, the main
thread first with its frames outermost first and the line of source; bounded in threads, frames and bytes."""

from __future__ import annotations

import json
import threading

from stallwatch.collect import stacks


def _parked(n: int) -> tuple[list[threading.Thread], threading.Event]:
    """`n` threads each parked 100 calls deep, all there when this returns."""
    release, parked = threading.Event(), threading.Semaphore(0)

    def deep(k: int) -> None:
        if k:
            deep(k - 1)
        else:
            parked.release()
            release.wait(30)

    threads = [threading.Thread(target=deep, args=(100,), name=f"parked-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for _ in threads:
        assert parked.acquire(timeout=30)
    return threads, release


def test_every_thread_but_the_callers_with_the_main_thread_first():
    _threads, release = _parked(3)
    try:
        result: dict = {}
        reader = threading.Thread(target=lambda: result.update(stacks.snapshot(7)), name="reader")
        reader.start()
        reader.join(10)
    finally:
        release.set()
    names = [t["name"] for t in result["threads"]]
    assert names[0] == "MainThread" and result["threads"][0]["main"] and "reader" not in names
    assert {f"parked-{i}" for i in range(3)} <= set(names) and result["request"] == 7
    main = result["threads"][0]["frames"]
    assert any("test_stacks.py" in f["file"] and "reader." in f["code"] for f in main)  # start() or join()
    parked = next(t for t in result["threads"] if t["name"] == "parked-0")
    assert len(parked["frames"]) == stacks.MAX_FRAMES and parked["frames_left_out"] > 0  # 100 deep, innermost kept
    assert parked["frames"][-1]["function"] in ("wait", "deep")  # parked (or a moment before)


def test_bounded_in_threads_and_bytes():
    _threads, release = _parked(stacks.MAX_THREADS + 6)
    try:
        dump = stacks.snapshot(1)
    finally:
        release.set()
    assert len(dump["threads"]) <= stacks.MAX_THREADS and dump["threads_left_out"] >= 6
    assert len(json.dumps(dump)) <= stacks.MAX_BYTES
