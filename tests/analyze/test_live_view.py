"""The summary as it stands now: a running job's stored figures brought up to date with its nodes' live counts
(the larger count, the duration so far, no finalization yet); a finished run keeps its stored figures."""

from __future__ import annotations

from stallwatch.analyze.live_view import live_figures, overview
from stallwatch.store.live_status import LiveNode, LiveRank

S = 1_000_000


def _node(name: str, steps: int, last: int, progress: tuple[tuple[int, int], ...]) -> LiveNode:
    return LiveNode(name, written_us=last, running=True,
                    ranks=(LiveRank(0, 1, {"TRAIN": steps}, {"TRAIN": steps - 1}, 10 * S, last),),
                    progress=progress, step_us={"TRAIN": 100}, phase_us={"TRAIN": {"forward": 25}})


def _overview(running: bool, live):
    return overview(running=running, start_us=0, now_us=40 * S, stored_steps={"TRAIN": 100}, stored_last_us=30 * S,
                    stored_duration_s=30.0, stored_ranks={"a": []}, stored_loop=(10 * S, 25 * S),
                    stored_parts={"Initialization": 10.0, "Training loop": 15.0, "Finalization": 5.0},
                    stored_progress={"t": [25 * S], "steps": [100]}, stored_shares={}, stored_latest=99, live=live)


def test_a_running_job_shows_its_live_counts() -> None:
    live = live_figures({"a": _node("a", 300, 39 * S, ((20 * S, 100), (36 * S, 200), (39 * S, 300))),
                         "b": _node("b", 50, 38 * S, ((38 * S, 50),))})
    assert live.steps == {"TRAIN": 350} and live.latest_step == 299
    assert live.progress == {"t": [20 * S, 36 * S, 38 * S, 39 * S], "steps": [100, 200, 250, 350]}
    assert abs(live.steps_per_s - 100 / 3) < 1e-6  # node a over its newest 3 s
    o = _overview(True, live)
    assert o.steps == {"TRAIN": 350} and o.duration_s == 40.0 and o.ranks == {"a": ["0"], "b": ["0"]}
    assert o.parts_s == {"Initialization": 10.0, "Training loop": 29.0}  # no finalization while it runs
    assert o.phase_shares == {"TRAIN": {"forward": 25.0}} and o.latest_step == 299


def test_a_finished_run_keeps_its_stored_figures_but_a_finer_progress() -> None:
    live = live_figures({"a": _node("a", 100, 25 * S, ((15 * S, 40), (20 * S, 80), (25 * S, 100)))})
    o = _overview(False, live)
    assert o.steps == {"TRAIN": 100} and o.duration_s == 30.0 and o.parts_s["Finalization"] == 5.0
    assert o.progress["steps"] == [40, 80, 100]
    stale = live_figures({"a": _node("a", 60, 20 * S, ((15 * S, 40), (20 * S, 60)))})  # e.g. a resumed node's
    assert _overview(False, stale).progress == {"t": [25 * S], "steps": [100]}
    assert _overview(True, None).steps == {"TRAIN": 100}
