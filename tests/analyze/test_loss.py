"""What a run is missing is said: dropped framework events (recorded as `loss` events) and stretches
without system samples become notes of the analysis, shown by summary, report and info."""

from __future__ import annotations

import json

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.loss import sample_gaps
from stallwatch.records import LOSS, FrameworkEvent
from stallwatch.store.framework_writer import FrameworkWriter
from stallwatch.store.location import RunLocation

from ..run_builder import T0, NodeData, S, feed, make_run, node_record, write_node_json, writer_for


def test_a_gap_in_system_samples_is_a_note_and_steady_samples_are_not(tmp_path):
    location = RunLocation(str(tmp_path))
    make_run(tmp_path, nodes=("a",), seconds=10)
    steady = RunAnalysis(str(tmp_path))
    assert steady.losses.gaps == [] and steady.notes == []
    w = writer_for(location, "b")
    data = NodeData("b")
    feed(w, data, 1, 0, 5)
    feed(w, data, 1, 12, 5)  # the sampler was stopped for 7 s
    w.close()
    write_node_json(location, node_record("b", T0, T0 + 17 * S, samples=10))
    analysis = RunAnalysis(str(tmp_path))
    [gap] = analysis.losses.gaps
    assert (gap.node, gap.start_us, gap.end_us) == ("b", T0 + 4 * S, T0 + 12 * S)
    assert any(n.startswith("no system samples on b for 8.0 s") for n in analysis.notes), analysis.notes


def test_dropped_events_are_summed_per_rank_and_said(tmp_path):
    make_run(tmp_path, nodes=("a",), seconds=10)
    w = FrameworkWriter(RunLocation(str(tmp_path)), "a", 3, flush_interval_us=S, max_bytes=1 << 30)
    for first, events, steps in ((T0 + 2 * S, 100, 20), (T0 + 5 * S, 50, 5)):
        w.append(FrameworkEvent(LOSS, "events_dropped", first, first + S, "GLOBAL", None, 7,
                                json.dumps({"events": events, "steps": steps})))
    w.close()
    analysis = RunAnalysis(str(tmp_path))
    [loss] = analysis.losses.events
    assert (loss.node, loss.rank, loss.events, loss.steps) == ("a", 3, 150, 25)
    assert (loss.first_us, loss.last_us) == (T0 + 2 * S, T0 + 6 * S)
    assert any("25 steps (150 events) of rank 3 on a were lost" in n for n in analysis.notes)
    assert "25 steps (150 events) of rank 3" in "\n".join(analysis.summary.notes)


def test_sample_gaps_follow_the_sampling_interval():
    ts = [0, 1 * S, 2 * S, 9 * S, 10 * S]
    assert [(g.start_us, g.end_us) for g in sample_gaps("n", ts, 1000)] == [(2 * S, 9 * S)]
    assert sample_gaps("n", ts, 5000) == []  # 7 s is under three 5 s intervals: not a gap
    assert sample_gaps("n", [], 1000) == [] and sample_gaps("n", [5], 1000) == []
