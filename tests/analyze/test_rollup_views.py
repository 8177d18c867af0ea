"""The dashboard's overview from rollups against the same analysis from every sample and event, on a run written
by the real writers: counts, spans, phase shares, markers, means and maxima agree; a wide range is drawn from a
rollup level with its planted peak, a one-minute zoom from the snapshots themselves."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.records import FrameworkEvent
from stallwatch.store import layout
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation
from tests.run_builder import KEYS, T0, S, make_run

SECONDS = 600
SLOW_STEP = 321  # planted: 0.3 s longer than the others


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollups") / "run"
    make_run(root, nodes=("algo-1",), seconds=SECONDS)
    location = RunLocation(str(root))
    for rank in (0, 1):
        w = FrameworkWriter(location, "algo-1", rank, flush_interval_us=2 * S, max_bytes=1 << 30, segment_us=50 * S)
        w.append(FrameworkEvent(pid=1, kind="loop", name="loader", mode="TRAIN", step=None, start_us=T0, end_us=T0,
                                args=None))
        for i in range(2 * (SECONDS - 5)):
            start = T0 + 1000 + i * 500_000
            mode = "EVAL" if i % 50 >= 45 else "TRAIN"
            dur = 450_000 + (300_000 if i == SLOW_STEP else 0)
            for kind, a, b in (("data_wait", 0, 40_000), ("forward", 40_000, 200_000), ("backward", 200_000, 400_000)):
                w.append(FrameworkEvent(pid=1, kind=kind, name=kind, mode=mode, step=i, start_us=start + a,
                                        end_us=start + b, args=None))
            w.append(FrameworkEvent(pid=1, kind="step", name="step", mode=mode, step=i, start_us=start,
                                    end_us=start + dur, args=None))
            w.tick(start)
        w.close()
    record = json.loads(location.read(layout.node_json("algo-1")))
    record["ranks"] = [{"rank": 0}, {"rank": 1}]
    location.write_atomic(layout.node_json("algo-1"), json.dumps(record).encode())
    return root


def test_the_summary_from_rollups_is_the_summary_from_every_event(run_dir):
    exact, rolled = RunAnalysis(str(run_dir)), RunAnalysis(str(run_dir), overview_from_rollups=True)
    assert rolled.summary.steps == exact.summary.steps and sum(exact.summary.steps.values()) == 4 * (SECONDS - 5)
    assert rolled.summary.loop == exact.summary.loop
    for mode, shares in exact.phase_shares.items():
        assert rolled.phase_shares[mode] == pytest.approx(shares, rel=1e-9)
    assert rolled.loop_shapes == exact.loop_shapes and rolled.notes == exact.notes
    assert rolled.latest_step == exact.latest_step
    assert rolled.progress()["steps"][-1] == exact.progress()["steps"][-1]
    assert rolled.recent_steps("algo-1", 30) == exact.recent_steps("algo-1", 30)
    whole_e, whole_r = exact.events_window("algo-1", None, None, limit=100), \
        rolled.events_window("algo-1", None, None, limit=100)
    assert whole_r.totals == pytest.approx(whole_e.totals) and whole_r.total_events == whole_e.total_events


def test_neither_summary_reads_every_step_of_the_run_at_once(run_dir, monkeypatch):
    """The dashboard's summary comes from the rollups alone; the exact one node by node (issue 15's bound)."""
    rolled = RunAnalysis(str(run_dir), overview_from_rollups=True)
    rolled.framework_rollup  # noqa: B018 - built (and cached) before the segments are made unreadable
    monkeypatch.setattr(rolled.run, "framework", lambda *a, **k: pytest.fail("read the framework segments"))
    assert sum(rolled.summary.steps.values()) == 4 * (SECONDS - 5)
    monkeypatch.undo()
    exact = RunAnalysis(str(run_dir))
    assert sum(exact.summary.steps.values()) == 4 * (SECONDS - 5)
    assert "steps" not in exact.__dict__ and "step_events" not in exact.__dict__


def test_usage_from_rollups_has_the_exact_means_and_maxima(run_dir):
    exact = {u.label: u for u in RunAnalysis(str(run_dir)).usage("algo-1")}
    rolled = {u.label: u for u in RunAnalysis(str(run_dir), overview_from_rollups=True).usage("algo-1")}
    assert set(rolled) == set(exact)
    for label, u in exact.items():
        if label != "CPU busiest core":  # per bucket there, not per snapshot
            assert rolled[label].mean == pytest.approx(u.mean, rel=1e-5) and rolled[label].count == u.count
        assert rolled[label].max == u.max


def test_a_wide_range_is_drawn_from_a_rollup_level_and_a_minute_from_every_snapshot(run_dir):
    exact, rolled = RunAnalysis(str(run_dir)), RunAnalysis(str(run_dir), overview_from_rollups=True)
    wide = rolled.node_series("algo-1", None, None, 30)
    assert wide.bucket_us % 10_000_000 == 0 and len(wide.ts) <= 30 and not wide.full_resolution
    assert wide.snapshots == SECONDS
    raw = exact.system("algo-1").columns
    for name, col in (("cpu", "cpu/cpu_util"), ("cpu0", "cpu0/cpu_util"), ("gpu0", "gpu0/gpu_util")):
        assert float(np.nanmax(wide.series[name].max)) == float(np.nanmax(raw[col]))
        assert float(np.nanmin(wide.series[name].min)) == float(np.nanmin(raw[col]))
    assert [k.column for k in KEYS]  # the run's series are the builder's
    frm = T0 + 200 * S
    zoom_r = rolled.node_series("algo-1", frm, frm + 60 * S, 650)
    zoom_e = exact.node_series("algo-1", frm, frm + 60 * S, 650)
    assert zoom_r.full_resolution and zoom_r.snapshots == 60
    np.testing.assert_array_equal(zoom_r.ts, zoom_e.ts)
    np.testing.assert_array_equal(zoom_r.series["cpu0"].max, zoom_e.series["cpu0"].max)
