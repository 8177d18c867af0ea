"""The catalogue of what is shown and its units: one colour per phase, told apart within each chart's family,
found by any of its names; every stored metric the sampler writes named once; numbers formatted to be read."""

from __future__ import annotations

import math

import pytest
from bokeh.palettes import Viridis256

from stallwatch import catalogue, records
from stallwatch.units import format_keyed, format_value, number, unit_of_key


@pytest.mark.parametrize("family", [catalogue.STEP_PARTS, catalogue.MODES, catalogue.JOB_PARTS, catalogue.FLAGS])
def test_the_phases_a_chart_draws_together_have_distinct_colours(family):
    colours = [p.colour.lower() for p in family]
    assert len(set(colours)) == len(colours)
    assert all(len(c) == 7 and c.startswith("#") for c in colours)


def test_every_name_of_a_phase_finds_its_one_colour():
    for p in catalogue.PHASES:
        for name in (p.key, p.label, *p.aliases, p.label.upper()):
            assert catalogue.phase(name) is not None, name
            # a name two families share (none should) would give one of them the other's colour
            assert catalogue.colour(name) in {q.colour for q in catalogue.PHASES if name.lower() in
                                              {n.lower() for n in (q.key, q.label, *q.aliases)}}
    for kind in (records.DATA_WAIT, records.FORWARD, records.BACKWARD, records.OPTIMIZER, records.COLLECTIVE):
        assert catalogue.phase(kind) in catalogue.STEP_PARTS
    assert catalogue.colour("aten::mm") is None and catalogue.label("aten::mm") == "aten::mm"


def test_a_charts_other_names_take_free_colours_in_order_and_phases_keep_theirs():
    one = catalogue.colours(["forward", "aten::mm", "backward"])
    two = catalogue.colours(["backward", "conv", "forward", "aten::mm"])
    assert one["forward"] == two["forward"] == catalogue.colour("forward")
    assert one["backward"] == two["backward"]
    assert one["aten::mm"] not in (one["forward"], one["backward"])
    assert len(set(two.values())) == 4


def test_the_heatmap_palette_is_bokehs_viridis_and_the_metrics_are_named_once():
    assert catalogue.HEAT_PALETTE == tuple(Viridis256)
    keys = [(m.device, m.metric) for m in catalogue.METRICS]
    assert len(keys) == len(set(keys))
    assert catalogue.metric("gpu3", records.GPU_UTIL).label == "GPU"
    assert catalogue.metric("cpu", records.CPU_UTIL).label == "CPU total"
    assert catalogue.metric("cpu12", records.CPU_UTIL).label == "{device}"
    assert catalogue.metric("proc", records.PROC_CPU_UTIL).label == "Job CPU"
    assert catalogue.metric("gpu0", "no_such_metric") is None
    doc = catalogue.to_json()
    assert {p["key"] for p in doc["step_parts"]} >= {"data_wait", "forward", "backward", "optimizer", "collective"}
    assert doc["units"]["B/s"]["ladder"][0] == [1e12, "TB/s"]


@pytest.mark.parametrize("value, unit, text", [
    (1200.0, "B/s", "1.2 kB/s"), (0.0012e6, "B/s", "1.2 kB/s"), (999_800.0, "B/s", "1 MB/s"),
    (2.5e9, "B", "2.5 GB"), (0.04, "s", "40 ms"), (0.0, "s", "0 s"), (5e-7, "s", "0.5 µs"),
    (3.2, "s", "3.2 s"), (7_300.0, "s", "2.03 h"), (93.21, "%", "93.2 %"), (0.0123, "%", "0.0123 %"),
    (1_234_567.0, "count", "1,234,567"), (12.345, "ms", "12.3 ms"), (-0.5, "%", "-0.5 %"), (None, "%", "–"),
    (math.nan, "B/s", "–"), (150.0, "W", "150 W"),
])
def test_a_value_reads_in_three_significant_digits_and_the_right_unit(value, unit, text):
    assert format_value(value, unit) == text


def test_numbers_are_never_scientific_nor_fifteen_digits():
    assert number(0.000123456) == "0.000123" and number(123456.789) == "123,457" and number(0.1 + 0.2) == "0.3"
    assert unit_of_key("time_at_stake_s") == "s" and unit_of_key("rss_bytes") == "B" and unit_of_key("steps") == ""


def test_a_named_value_reads_by_what_its_name_says():
    assert format_keyed("wait_share", 31.52) == "31.5 %" and format_keyed("share", 83.61) == "83.6 %"
    assert format_keyed("pid", 6439) == "6439" and format_keyed("worst_rank", 12) == "12"
    assert format_keyed("excess_us", 1234.0) == "1.23 ms" and format_keyed("triggered", False) == "no"
    assert format_keyed("start_us", 1_764_382_882_000_000) == "2025-11-29 02:21:22 UTC"
    assert format_keyed("steps", 12_000) == "12,000" and format_keyed("quota_cores", None) == "–"
    assert format_keyed("excess_s_per_step", 0.04502333333333334) == "45 ms"  # a time named after a step: not an id
    assert format_keyed("first_step", 20) == "20"
