"""System snapshots to Parquet bytes and back to tidy rows: values, resolution, filters, empty schema."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallwatch.records import MetricKey, system_schema
from stallwatch.store.layout import PART, SEGMENT
from stallwatch.store.system_codec import decimals_for, encode, to_tidy

T0 = 1_763_790_000_000_000
KEYS = [
    MetricKey("cpu", "cpu_util"),
    MetricKey("cpu0", "cpu_util"),
    MetricKey("memory", "mem_used_bytes"),
    MetricKey("gpu0", "gpu_power_w"),
    MetricKey("proc", "num_procs"),
]


def _decode(data: bytes) -> pa.Table:
    """Segments are Parquet."""
    return pq.read_table(io.BytesIO(data))


def _rows(table: pa.Table) -> list[tuple]:
    d = table.to_pydict()
    return list(zip(d["timestamp_us"], d["node"], d["device"], d["metric"], d["value"]))


def test_round_trip_values_and_nan_rows_dropped():
    """Every non-NaN cell comes back as one tidy row; NaN cells are absent, not zero."""
    ts = np.array([T0, T0 + 500_000, T0 + 1_000_000], dtype=np.int64)
    values = np.array([
        [10.0, 20.0, 1024.0, 150.0, 3.0],
        [11.0, np.nan, 2048.0, np.nan, 4.0],
        [np.nan, np.nan, np.nan, np.nan, np.nan],
    ])
    out = to_tidy(_decode(encode(SEGMENT, KEYS, ts, values)), "algo-1")
    assert out.schema == system_schema()
    assert sorted(_rows(out)) == sorted([
        (T0, "algo-1", "cpu", "cpu_util", 10.0),
        (T0, "algo-1", "cpu0", "cpu_util", 20.0),
        (T0, "algo-1", "memory", "mem_used_bytes", 1024.0),
        (T0, "algo-1", "gpu0", "gpu_power_w", 150.0),
        (T0, "algo-1", "proc", "num_procs", 3.0),
        (T0 + 500_000, "algo-1", "cpu", "cpu_util", 11.0),
        (T0 + 500_000, "algo-1", "memory", "mem_used_bytes", 2048.0),
        (T0 + 500_000, "algo-1", "proc", "num_procs", 4.0),
    ])


def test_file_shape_one_wide_row_per_snapshot():
    """The file is one row group, timestamp plus one float32 column per key, NaN stored as null."""
    ts = np.array([T0, T0 + 1], dtype=np.int64)
    values = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [np.nan, 2.0, 3.0, 4.0, 5.0]])
    data = encode(SEGMENT, KEYS, ts, values)
    pf = pq.ParquetFile(io.BytesIO(data))
    assert pf.metadata.num_row_groups == 1
    assert pf.metadata.num_rows == 2
    assert pf.schema_arrow.names == ["timestamp_us"] + [k.column for k in KEYS]
    assert pf.schema_arrow.field("cpu/cpu_util").type == pa.float32()
    assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
    table = pf.read()
    assert table.column("cpu/cpu_util").null_count == 1
    assert table.column("timestamp_us").to_pylist() == [T0, T0 + 1]


def test_rounding_to_stored_resolution():
    """Values come back at their metric's resolution, free of float32 noise."""
    keys = [MetricKey("cpu", "cpu_util"), MetricKey("cpu", "cpu_iowait"), MetricKey("gpu0", "gpu_power_w"),
            MetricKey("gpu0", "gpu_temp_c"), MetricKey("disk", "disk_read_bps"), MetricKey("gpu0", "gpu_sm_clock_mhz"),
            MetricKey("proc", "rss_bytes")]
    values = np.array([[37.123456, 0.105, 123.456, 65.44, 1234.6, 1410.4, 4097.4]])
    out = to_tidy(_decode(encode(SEGMENT, keys, np.array([T0]), values)), "n")
    got = {(d, m): v for _, _, d, m, v in _rows(out)}
    assert got == {
        ("cpu", "cpu_util"): 37.12,
        ("cpu", "cpu_iowait"): round(0.105, 2),
        ("gpu0", "gpu_power_w"): 123.5,
        ("gpu0", "gpu_temp_c"): 65.4,
        ("disk", "disk_read_bps"): 1235.0,
        ("gpu0", "gpu_sm_clock_mhz"): 1410.0,
        ("proc", "rss_bytes"): 4097.0,
    }


def test_decimals_for_known_suffixes():
    """Each metric family has its documented resolution; unknown metrics keep float32 precision."""
    assert decimals_for("gpu_mem_bw_util") == 2
    assert decimals_for("net_tx_bps") == 0
    assert decimals_for("gpu_temp_c") == 1
    assert decimals_for("num_procs") is None
    assert decimals_for("workers_alive") is None


def test_metrics_filter():
    """Only the named metrics are returned, on every device that has them."""
    ts = np.array([T0, T0 + 1], dtype=np.int64)
    values = np.arange(10, dtype=np.float64).reshape(2, 5)
    table = _decode(encode(SEGMENT, KEYS, ts, values))
    out = to_tidy(table, "n", metrics={"cpu_util"})
    assert sorted(_rows(out)) == [
        (T0, "n", "cpu", "cpu_util", 0.0), (T0, "n", "cpu0", "cpu_util", 1.0),
        (T0 + 1, "n", "cpu", "cpu_util", 5.0), (T0 + 1, "n", "cpu0", "cpu_util", 6.0),
    ]
    empty = to_tidy(table, "n", metrics={"no_such_metric"})
    assert empty.num_rows == 0 and empty.schema == system_schema()


def test_time_range_is_start_inclusive_end_exclusive():
    """[start_us, end_us): the first bound is kept, the second is not."""
    ts = T0 + np.arange(5, dtype=np.int64) * 100
    values = np.arange(5, dtype=np.float64).reshape(5, 1)
    table = _decode(encode(SEGMENT, [MetricKey("cpu", "cpu_util")], ts, values))
    got = to_tidy(table, "n", start_us=T0 + 100, end_us=T0 + 300)
    assert got.column("timestamp_us").to_pylist() == [T0 + 100, T0 + 200]
    assert got.column("value").to_pylist() == [1.0, 2.0]
    assert to_tidy(table, "n", start_us=T0 + 400).column("value").to_pylist() == [4.0]
    assert to_tidy(table, "n", end_us=T0 + 1).column("value").to_pylist() == [0.0]


@pytest.mark.parametrize("kwargs", [
    {"start_us": T0 + 10_000},
    {"end_us": T0},
    {"metrics": set()},
])
def test_empty_results_have_the_documented_schema(kwargs):
    """An empty answer is still a table of system_schema(), so concatenation and pandas work."""
    ts = np.array([T0], dtype=np.int64)
    table = _decode(encode(SEGMENT, KEYS, ts, np.ones((1, 5))))
    out = to_tidy(table, "n", **kwargs)
    assert out.num_rows == 0
    assert out.schema == system_schema()


def test_all_nan_and_zero_rows_give_empty_tables_with_schema():
    """All-NaN snapshots and zero-row files yield empty tables of the same schema."""
    all_nan = to_tidy(_decode(encode(SEGMENT, KEYS, np.array([T0]), np.full((1, 5), np.nan))), "n")
    assert all_nan.num_rows == 0 and all_nan.schema == system_schema()
    zero = to_tidy(_decode(encode(SEGMENT, KEYS, np.zeros(0, dtype=np.int64), np.zeros((0, 5)))), "n")
    assert zero.num_rows == 0 and zero.schema == system_schema()


def test_tidy_tables_of_two_nodes_concatenate():
    """Dictionary columns of different files concatenate and decode to the right strings."""
    a = to_tidy(_decode(encode(SEGMENT, KEYS[:1], np.array([T0]), np.array([[1.0]]))), "a")
    b = to_tidy(_decode(encode(SEGMENT, KEYS[3:4], np.array([T0]), np.array([[2.0]]))), "b")
    both = pa.concat_tables([a, b])
    assert _rows(both) == [(T0, "a", "cpu", "cpu_util", 1.0), (T0, "b", "gpu0", "gpu_power_w", 2.0)]


def test_parts_are_arrow_ipc_and_read_back_like_segments():
    """A part (written every flush) is Arrow IPC; reading it gives the same tidy rows as a segment."""
    from stallwatch.store.system_codec import count_rows, read_columns, read_schema

    ts = np.array([T0, T0 + 500_000], dtype=np.int64)
    values = np.array([[10.0, 20.0, 1024.0, 150.0, 3.0], [11.0, np.nan, 2048.0, 151.0, 4.0]])
    part, seg = encode(PART, KEYS, ts, values), encode(SEGMENT, KEYS, ts, values)
    assert pa.ipc.open_file(io.BytesIO(part)).read_all().num_rows == 2
    for kind, data in ((PART, part), (SEGMENT, seg)):
        assert count_rows(pa.BufferReader(data), kind) == 2
        assert read_schema(pa.BufferReader(data), kind).names[0] == "timestamp_us"
    as_part = to_tidy(read_columns(pa.BufferReader(part), PART, None), "n")
    as_seg = to_tidy(read_columns(pa.BufferReader(seg), SEGMENT, None), "n")
    assert as_part.to_pylist() == as_seg.to_pylist()
    only_cpu = read_columns(pa.BufferReader(part), PART, {"cpu_util"})
    assert only_cpu.column_names == ["timestamp_us"] + [k.column for k in KEYS if k.metric == "cpu_util"]


def test_one_part_encoder_gives_every_flush_the_file_a_fresh_one_would():
    """The sampler's encoder keeps its schema and arrays over a scratch block between flushes: parts of any length
    (the block grows), one after another, are the files `encode` writes, values and NaN included."""
    from stallwatch.store.system_codec import PartEncoder, read_columns

    encoder = PartEncoder(KEYS)
    rng = np.random.default_rng(7)
    for n in (1, 10, 3, 40, 17, 2):
        ts = T0 + np.arange(n, dtype=np.int64) * 500_000
        values = rng.random((n, len(KEYS))) * 1e4
        values[0, 1] = np.nan
        got = pa.ipc.open_file(io.BytesIO(encoder.encode(ts, values))).read_all()
        fresh = pa.ipc.open_file(io.BytesIO(encode(PART, KEYS, ts, values))).read_all()
        assert got.schema.equals(fresh.schema) and got.num_rows == n
        assert all(c.null_count == 0 for c in got.columns)
        for a, b in zip(got.columns, fresh.columns):
            np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())  # NaN where NaN
        segment = read_columns(pa.BufferReader(encode(SEGMENT, KEYS, ts, values)), SEGMENT, None)
        assert to_tidy(got, "n").to_pylist() == to_tidy(segment, "n").to_pylist()  # rounded as segments are
