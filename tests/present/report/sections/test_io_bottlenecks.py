"""I/O bottlenecks on generated runs: the planted 30 snapshots on algo-1 (gpu0 at 5 % while core 1 waits on
I/O 60 %) are a rare, listed 15 s period below the threshold; without events on that node there is no loop
context; a CPU-only run is not applicable."""

from __future__ import annotations

import pytest

from stallwatch.present.report.model import GOOD, NotApplicable, Paragraph, Table
from stallwatch.present.report.sections import io_bottlenecks

from ._runs import IO_BOTTLENECK, blocks_of, built, rows_by, table

PLANTED = IO_BOTTLENECK[1] - IO_BOTTLENECK[0]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return built("gpu", tmp_path_factory)


def test_the_planted_period_is_counted_and_judged_rare(gpu):
    sections = io_bottlenecks.build(gpu)
    result = gpu.rule("IOBottleneck")
    assert result.violations == PLANTED
    intro = blocks_of(sections, Paragraph)[0].text
    share = 100 * PLANTED / result.datapoints
    assert f"found {PLANTED} I/O bottlenecks, which is {share:.1f} % of the time analyzed" in intro
    assert "On every node the share was below the threshold of 50 %" in intro
    (period,) = table(sections, "The longest I/O bottleneck periods").rows
    assert period[0] == "algo-1" and period[3] == PLANTED and period[4] == "15.0 s"
    assert rows_by(table(sections, "I/O bottlenecks per node"), "Node")[("algo-1",)]["I/O bottlenecks"] == PLANTED
    verdict = sections[0].blocks[-1]
    assert verdict.level == GOOD and "rare" in verdict.text


def test_no_loop_context_without_events_on_the_node(gpu):
    captions = [t.caption for t in blocks_of(io_bottlenecks.build(gpu), Table)]
    assert not any("training loop" in c for c in captions)  # algo-1 ran no ranks


def test_a_cpu_only_run_says_io_bottlenecks_do_not_apply(tmp_path_factory):
    (sec,) = io_bottlenecks.build(built("cpu_only", tmp_path_factory))
    assert isinstance(sec.blocks[0], NotApplicable) and sec.blocks[0].reason.startswith("No GPU on this run")
