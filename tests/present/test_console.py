"""Terminal text: aligned tables, human-readable numbers, the end-of-run summary."""

from __future__ import annotations

import math

import pytest

from stallwatch.analyze.steps import StepStat
from stallwatch.analyze.usage import NodeSpan, UsageStat
from stallwatch.present.console import human, run_summary, steps_table, table, usage_table

T0 = 1_763_790_000_000_000  # 2025-11-22 05:40:00 UTC


def test_table_pads_columns_and_aligns():
    """Columns are as wide as their widest cell, 'r' columns are right-aligned, no trailing spaces."""
    text = table(["name", "n"], [["a", "1"], ["longer", "100"]], "lr")
    assert text.splitlines() == [
        "name      n",
        "------  ---",
        "a         1",
        "longer  100",
    ]


def test_table_without_rows_and_default_alignment():
    """Headers alone still make a table; the default is left alignment."""
    assert table(["a", "bb"], []).splitlines() == ["a  bb", "-  --"]
    assert table(["x", "y"], [["1", "22"]]).splitlines()[-1] == "1  22"


@pytest.mark.parametrize(("value", "unit", "text"), [
    (0, "B", "0 B"),
    (999, "B", "999 B"),
    (999.6, "B", "1 kB"),  # not "1,000 B"
    (1024, "B", "1.02 kB"),
    (1536, "B/s", "1.54 kB/s"),
    (999_999, "B", "1 MB"),  # not "1,000 kB"
    (5e9, "B", "5 GB"),
    (3e12, "B/s", "3 TB/s"),
    (2048e12, "B", "2,048 TB"),  # T is the largest prefix
    (-2048, "B", "-2.05 kB"),
    (42.345, "%", "42.3%"),
    (100, "%", "100.0%"),
    (4, "", "4.0"),
    (math.nan, "%", "-"),
    (math.nan, "B", "-"),
])
def test_human(value, unit, text):
    """Byte sizes climb the units' decimal ladder (as on the report and the dashboard), percentages one decimal,
    NaN a dash."""
    assert human(value, unit) == text


def test_usage_table_rows():
    """One row per statistic, values formatted in their unit."""
    stats = [UsageStat("algo-1", "CPU total", "%", 47.55, 47.5, 93.21, 98.0, 30),
             UsageStat("algo-1", "Disk read", "B/s", 2048, 1024, 4096, 8192, 30)]
    lines = usage_table(stats).splitlines()
    assert lines[0].split() == ["node", "metric", "mean", "p50", "p95", "max"]
    assert lines[2].split() == ["algo-1", "CPU", "total", "47.5%", "47.5%", "93.2%", "98.0%"]
    assert lines[3].split() == ["algo-1", "Disk", "read", "2.05", "kB/s", "1.02", "kB/s", "4.1", "kB/s", "8.19",
                                "kB/s"]
    assert lines[2].endswith("98.0%") and lines[3].endswith("8.19 kB/s")  # right-aligned numbers


def test_run_summary_with_data():
    """The summary names the run, exit code, duration and span, snapshots per node, then the table."""
    text = run_summary(run_uri="runs/r1", exit_code=3, start_us=T0, end_us=T0 + 125_000_000,
                       spans=[NodeSpan("algo-1", 250, T0, T0 + 124_500_000)],
                       stats=[UsageStat("algo-1", "GPU", "%", 12.0, 10.0, 40.0, 55.0, 250)], sample_interval_ms=500)
    lines = text.splitlines()
    assert lines[0] == "stallwatch: run runs/r1"
    assert lines[1] == ("  command exit code 3, duration 2m 05s "
                        "(2025-11-22 05:40:00 UTC → 2025-11-22 05:42:05 UTC)")
    assert lines[2] == "  algo-1: 250 system snapshots, one every 500 ms"
    assert lines[3] == ""
    assert "12.0%" in lines[-1] and "55.0%" in lines[-1]


def test_run_summary_names_each_interval_the_sampling_was_changed_to():
    """Changed live (the dashboard, `stallwatch config`): the summary says so, not only the interval it began with."""
    text = run_summary(run_uri="r", exit_code=0, start_us=T0, end_us=T0 + 30_000_000,
                       spans=[NodeSpan("n1", 15, T0, T0 + 29_000_000), NodeSpan("n2", 60, T0, T0 + 29_000_000)],
                       stats=[], sample_interval_ms=500,
                       interval_changes={"n1": [(T0, 500.0), (T0 + 5_800_000, 5000.0)], "n2": []})
    lines = text.splitlines()
    assert lines[2] == "  n1: 15 system snapshots, one every 500 ms, then every 5000 ms from 05:40:05 UTC"
    assert lines[3] == "  n2: 60 system snapshots, one every 500 ms"


def test_run_summary_without_data():
    """No stored samples is said plainly instead of printing an empty table."""
    text = run_summary(run_uri="r", exit_code=0, start_us=T0, end_us=T0 + 1_500_000, spans=[], stats=[])
    assert text.splitlines() == [
        "stallwatch: run r",
        "  command exit code 0, duration 1.5 s (2025-11-22 05:40:00 UTC → 2025-11-22 05:40:01 UTC)",
        "  no system samples were stored",
    ]


def test_the_steps_table_shows_what_no_phase_covers():
    """"other" is the rest of the step, in none of the phases: where a loop without a DataLoader builds its
    batches by hand. A row without phases has none to subtract from."""
    text = steps_table([StepStat("vm", 0, "TRAIN", 150, 45.0, 60.9, 64.5, 129,
                                 {"forward": 44.2, "backward": 30.1, "optimizer": 2.6}),
                        StepStat("vm", 0, "GLOBAL", 3, 1.0, 1.0, 1.0, 0, {}),
                        StepStat("vm", 1, "TRAIN", 150, 45.0, 60.9, 64.5, 129, {"data_wait": 12.0})])
    header, _, train, other, untimed = text.splitlines()
    assert header.split()[-2:] == ["optimizer", "other"]
    assert train.split()[-5:] == ["-", "44%", "30%", "3%", "23%"] and other.split()[-1] == "-"
    assert untimed.split()[-5:] == ["12%", "-", "-", "-", "-"]  # no forward timed: the rest is not the loop's


def test_on_a_gpu_the_steps_table_says_its_phases_are_host_time():
    rows = [StepStat("vm", 0, "TRAIN", 200, 67.9, 68.2, 310.1, 0, {"forward": 3.0, "backward": 4.0, "optimizer": 3.0})]
    assert "host time" not in steps_table(rows)
    text = steps_table(rows, gpu=True)
    assert text.startswith(steps_table(rows)) and "host time" in text and "--detailed-profiling" in text
    assert "host time" not in steps_table([], gpu=True)



def test_sampled_steps_read_as_all_steps_and_the_timed_ones():
    text = steps_table([StepStat("vm", 0, "TRAIN", 2000, 0.05, 0.07, 1.2, 77, {"forward": 40.0}, untimed=198_000),
                        StepStat("vm", 1, "TRAIN", 150, 45.0, 60.9, 64.5, 129, {"forward": 40.0})])
    rows = text.splitlines()[2:]
    assert "200000 (2000 timed)" in rows[0] and "timed" not in rows[1]
