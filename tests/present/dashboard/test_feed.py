"""Live updates over server-sent events from a real server: a snapshot and a step appended to a running run
reach a connected client within seconds, and two clients of one run share ONE reader."""

from __future__ import annotations

import json
import queue
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallwatch.records import FrameworkEvent, MetricKey
from stallwatch.store import layout
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation
from stallwatch.store.system_writer import SystemWriter
from tests.present.dashboard.conftest import Dashboard, start_dashboard
from tests.present.generated_run import training_run

S = 1_000_000


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[tuple[Dashboard, Path]]:
    """A run whose node is still running (its record says so), served alone."""
    run = training_run(tmp_path / "live-run", n=240)
    loc = RunLocation(str(run))
    record = json.loads(loc.read(layout.node_json("algo-1")))
    loc.write_atomic(layout.node_json("algo-1"), json.dumps({**record, "status": "running"}).encode())
    d = start_dashboard(run)
    yield d, run
    d.stop()


def _listen(url: str, into: queue.Queue, stop: threading.Event, token: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, headers={"authorization": f"Bearer {token}"}),
                                timeout=30) as r:
        name = None
        for raw in r:
            if stop.is_set():
                return
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                into.put((name, json.loads(line[6:])))


def _wait_for(q: queue.Queue, event: str, timeout: float = 15.0) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            name, data = q.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if name == event:
            return data
    raise AssertionError(f"no {event!r} event within {timeout} s")


def test_appended_sample_and_step_reach_the_client_through_one_reader(live_run: tuple[Dashboard, Path]) -> None:
    d, run = live_run
    stop = threading.Event()
    q1: queue.Queue = queue.Queue()
    q2: queue.Queue = queue.Queue()
    url = d.url + "api/run/live-run/live"
    for q in (q1, q2):
        threading.Thread(target=_listen, args=(url, q, stop, d.token), daemon=True).start()
    hellos = [_wait_for(q1, "hello"), _wait_for(q2, "hello")]
    # the later tab is told of two clients (the earlier one too, when both subscribed before either's hello was
    # sent), and both share one reader
    assert max(h["clients"] for h in hellos) == 2 and {h["readers"] for h in hellos} == {1}

    loc = RunLocation(str(run))
    summary = d.json("/api/run/live-run/summary")
    last = summary["last_us"]
    keys = [MetricKey("cpu", "cpu_util"), MetricKey("gpu0", "gpu_util")]
    w = SystemWriter(loc, "algo-1", keys, interval_us=500_000, flush_interval_us=600 * S, max_bytes=1 << 30)
    planted = 77.0
    for i in range(4):
        ts = last + (i + 1) * 500_000
        w.append(ts, np.array([planted, 12.5]))
        w.tick(ts)
    w.close()
    got = _wait_for(q1, "samples")
    assert got["node"] == "algo-1" and got["series"]["cpu"] == [planted] * 4 and got["series"]["gpu"] == [12.5] * 4
    assert _wait_for(q2, "samples")["ts"] == got["ts"]  # the other tab gets the same delta

    fw = FrameworkWriter(loc, "algo-1", 0, flush_interval_us=600 * S, max_bytes=1 << 30)
    t = max(last, summary["progress"]["t"][-1]) + 10 * S  # after every stored event
    fw.append(FrameworkEvent("step", "step", t, t + 100_000, "TRAIN", 999_999, 1, ""))
    fw.append(FrameworkEvent("forward", "forward", t + 10_000, t + 40_000, "TRAIN", 999_999, 1, ""))
    fw.close()
    steps = _wait_for(q1, "steps")
    assert steps["new"] == {"TRAIN": 1} and steps["recent"][-1]["step"] == 999_999
    assert steps["recent"][-1]["phases_ms"] == {"forward": 30.0}
    assert d.json("/api/health")["readers_started"] == 1
    stop.set()
