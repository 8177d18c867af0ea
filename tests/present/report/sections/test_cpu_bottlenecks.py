"""CPU bottlenecks on generated runs: the planted 300 snapshots (algo-2: gpu0 at 5 % while core 0 is at 95 %)
are counted once in the pie (the seeds subtracted the wrong count), listed as one 150 s period, and what the
training loop did during it is the overlap of its stored events with that period, summed by hand here."""

from __future__ import annotations

import pytest

from stallwatch.present.report.model import WARN, Chart, NotApplicable
from stallwatch.present.report.sections import cpu_bottlenecks

from ._runs import CPU_BOTTLENECK, INTERVAL_US, IO_BOTTLENECK, blocks_of, built, glyph_sources, rows_by, table

PLANTED = CPU_BOTTLENECK[1] - CPU_BOTTLENECK[0]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return built("gpu", tmp_path_factory)


def test_the_pie_counts_each_snapshot_once(gpu):
    sections = cpu_bottlenecks.build(gpu)
    result = gpu.rule("CPUBottleneck")
    datapoints, low = result.datapoints, result.details["low_gpu_utilization"]
    assert result.details["bottlenecks"]["count"] == PLANTED
    assert low == PLANTED + (IO_BOTTLENECK[1] - IO_BOTTLENECK[0])  # algo-1's gpu0 idles during its I/O bottleneck
    (pie,) = [c for c in blocks_of(sections, Chart) if c.caption.startswith("Snapshots analyzed")]
    slices = {w.data["label"][0]: w.data["value"][0] for w in glyph_sources(pie.model, "Wedge")}
    assert slices == {"GPU usage above threshold": datapoints - low,
                      "GPU usage below threshold, no CPU bottleneck": low - PLANTED,
                      "Low GPU usage due to CPU bottlenecks": PLANTED}
    assert sum(slices.values()) == datapoints


def test_the_planted_period_and_the_node_above_threshold(gpu):
    sections = cpu_bottlenecks.build(gpu)
    (period,) = table(sections, "The longest CPU bottleneck periods").rows
    assert period[0] == "algo-2" and period[3] == PLANTED and period[4] == "2 min 30 s"
    nodes = rows_by(table(sections, "CPU bottlenecks per node"), "Node")
    assert nodes[("algo-2",)]["Above threshold"] == "yes" and nodes[("algo-1",)]["CPU bottlenecks"] == 0
    verdict = sections[0].blocks[-1]
    assert verdict.level == WARN and "node algo-2" in verdict.text and "num_workers" in verdict.text


def _overlaps_by_hand(ctx, lo: int, hi: int) -> dict[str, float]:
    """Rank-seconds of each part of the loop inside [lo, hi) on algo-2, one event at a time."""
    kinds = {"data_wait": "waiting for data", "forward": "forward", "backward": "backward",
             "optimizer": "optimizer step"}
    out = {label: 0.0 for label in kinds.values()}
    in_steps = 0.0
    ranks = set()
    for e in ctx.run.framework().to_pylist():
        if e["node"] != "algo-2":
            continue
        ranks.add(e["rank"])
        seconds = max(0, min(e["end_us"], hi) - max(e["start_us"], lo)) / 1e6
        if e["kind"] == "step":
            in_steps += seconds
        elif e["kind"] in kinds:
            out[kinds[e["kind"]]] += seconds
    out["rest of the steps"] = in_steps - sum(out.values())
    out["outside steps"] = len(ranks) * (hi - lo) / 1e6 - in_steps
    return out


def test_the_loop_during_the_bottleneck_is_the_overlap_of_its_events(gpu):
    (r,) = gpu.rule("CPUBottleneck").details["bottlenecks"]["ranges"]
    expected = _overlaps_by_hand(gpu, r["start_us"], r["end_us"] + INTERVAL_US)
    rows = rows_by(table(cpu_bottlenecks.build(gpu), "The training loop during CPU bottlenecks"),
                   "Where the time went")
    got = {k[0]: v["Rank-seconds"] for k, v in rows.items()}
    assert got == pytest.approx({k: v for k, v in expected.items() if v > 0})
    assert sum(got.values()) == pytest.approx(2 * PLANTED * INTERVAL_US / 1e6)  # 2 ranks, the whole period
    assert got["outside steps"] > 0  # the loop began 5 s into the period


def test_a_cpu_only_run_says_cpu_bottlenecks_do_not_apply(tmp_path_factory):
    (sec,) = cpu_bottlenecks.build(built("cpu_only", tmp_path_factory))
    assert isinstance(sec.blocks[0], NotApplicable) and sec.blocks[0].reason.startswith("No GPU on this run")
