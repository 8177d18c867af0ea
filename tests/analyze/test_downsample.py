"""Peak-keeping downsampling: spikes and dips survive, NaN gaps stay gaps, sizes are bounded, time stays ordered."""

from __future__ import annotations

import numpy as np
import pytest

from stallwatch.analyze.downsample import minmax, minmax_matrix

T0 = 1_700_000_000_000_000
STEP = 500_000  # 500 ms in µs


def _series(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ts = T0 + np.arange(n, dtype=np.int64) * STEP
    return ts, (40 + 10 * rng.random(n)).astype(np.float32)


def test_single_sample_spike_and_dip_survive():
    ts, v = _series(200_000)
    v[123_457] = 100.0   # one-sample spike: naive decimation (every 100th sample) would drop it
    v[77_771] = 0.0      # one-sample dip
    assert 100.0 not in v[::100] and 0.0 not in v[::100]
    out_ts, out_v = minmax(ts, v, 1000)
    assert len(out_ts) <= 2000
    assert out_v.max() == 100.0 and out_v.min() == 0.0
    assert out_ts[np.argmax(out_v)] == ts[123_457]
    assert out_ts[np.argmin(out_v)] == ts[77_771]


def test_every_bucket_keeps_its_extremes():
    ts, v = _series(50_000, seed=3)
    out_ts, out_v = minmax(ts, v, 100)
    width = -(-(int(ts[-1]) - int(ts[0]) + 1) // 100)
    ids, out_ids = (ts - ts[0]) // width, (out_ts - ts[0]) // width
    for b in (0, 17, 99):
        assert out_v[out_ids == b].max() == v[ids == b].max()
        assert out_v[out_ids == b].min() == v[ids == b].min()


def test_output_time_ordered_and_points_are_real_samples():
    ts, v = _series(30_000, seed=1)
    out_ts, out_v = minmax(ts, v, 250)
    assert np.all(np.diff(out_ts) > 0)
    pos = np.searchsorted(ts, out_ts)
    assert np.array_equal(ts[pos], out_ts) and np.array_equal(v[pos], out_v)


def test_unsorted_input_comes_out_ordered():
    ts, v = _series(10_000, seed=2)
    order = np.random.default_rng(0).permutation(len(ts))
    out_ts, out_v = minmax(ts[order], v[order], 100)
    ref_ts, ref_v = minmax(ts, v, 100)
    assert np.array_equal(out_ts, ref_ts) and np.array_equal(out_v, ref_v)


def test_nan_gaps_are_skipped_but_break_the_line():
    ts, v = _series(100_000, seed=4)
    v[40_000:60_000] = np.nan        # the sampler saw nothing for a while: 20 % of the run
    v[10] = np.nan                   # a lone missing value inside a bucket with data
    out_ts, out_v = minmax(ts, v, 500)
    assert len(out_ts) <= 1000
    gap = (out_ts >= ts[40_000]) & (out_ts < ts[60_000])
    assert gap.any() and np.isnan(out_v[gap]).any()   # the gap is still a gap
    assert not np.isnan(out_v[~gap]).any()            # a NaN never beats a real value
    assert np.nanmax(out_v) == np.nanmax(v) and np.nanmin(out_v) == np.nanmin(v)


def test_small_input_returned_as_is():
    ts, v = _series(150)
    out_ts, out_v = minmax(ts, v, 100)
    assert np.array_equal(out_ts, ts) and np.array_equal(out_v, v)


def test_flat_series_collapses_to_one_point_per_bucket():
    ts = T0 + np.arange(10_000, dtype=np.int64) * STEP
    out_ts, out_v = minmax(ts, np.full(10_000, 7.0), 50)
    assert len(out_ts) == 50 and np.all(out_v == 7.0)


def test_bad_arguments_are_named():
    ts, v = _series(10)
    with pytest.raises(ValueError, match="buckets"):
        minmax(ts, v, 0)
    with pytest.raises(ValueError, match="as long as ts"):
        minmax(ts, v[:5], 3)


def test_matrix_buckets_min_max_mean():
    ts, _ = _series(10_000)
    rng = np.random.default_rng(5)
    m = rng.random((10_000, 3)).astype(np.float32) * 100
    m[5_000, 1] = 1000.0
    m[:, 2] = np.nan
    m[100:200, 0] = np.nan
    b = minmax_matrix(ts, m, 100)
    assert len(b.start) == 100 and b.min.shape == b.max.shape == b.mean.shape == (100, 3)
    assert np.all(np.diff(b.start) == b.width)
    assert b.start[0] == ts[0] and b.start[-1] <= ts[-1] < b.start[-1] + b.width
    ids = (ts - ts[0]) // b.width
    for j in range(2):
        for i in (0, 50, 99):
            col = m[ids == i, j]
            assert b.min[i, j] == np.nanmin(col) and b.max[i, j] == np.nanmax(col)
            assert b.mean[i, j] == pytest.approx(np.nanmean(col), rel=1e-5)
    assert b.max[:, 1].max() == 1000.0
    assert np.isnan(b.mean[:, 2]).all()   # a series that never had a value stays empty


def test_matrix_keeps_empty_buckets_on_the_grid():
    ts, _ = _series(2_000)
    ts = np.r_[ts[:1000], ts[1000:] + 3600 * 1_000_000]   # one hour without snapshots
    m = np.ones((2_000, 2), dtype=np.float32)
    b = minmax_matrix(ts, m, 200)
    assert len(b.start) <= 200 and np.all(np.diff(b.start) == b.width)
    assert np.isnan(b.mean[:, 0]).sum() > 100   # the hour is empty, not smeared
    assert np.nansum(b.mean[:, 0]) == np.count_nonzero(~np.isnan(b.mean[:, 0]))


def test_matrix_never_finer_than_the_sampling():
    ts, _ = _series(50)
    b = minmax_matrix(ts, np.ones((50, 1), dtype=np.float32), 1000)
    assert len(b.start) <= 50 and not np.isnan(b.mean).any()   # no striped empty buckets between samples


def test_jittered_snapshots_leave_no_empty_bucket():
    """A sampler's ticks jitter by milliseconds: at snapshot resolution no bucket comes out empty (drawn as a gap
    in the dashboard's lines and heatmap while the job ran)."""
    rng = np.random.default_rng(3)
    ts = (np.arange(40) * 500_006 + rng.integers(-40_000, 40_000, 40)).astype(np.int64)
    b = minmax_matrix(ts, np.ones((40, 2), np.float32), 600)
    assert not np.isnan(b.mean).any()
    ts_gap = np.r_[ts[:20], ts[20:] + 5_000_000]  # a real gap of ten intervals stays one
    assert np.isnan(minmax_matrix(ts_gap, np.ones((40, 1), np.float32), 600).mean).any()


def test_snapshots_a_hair_apart_from_the_interval_leave_no_empty_bucket():
    """Eight snapshots 499–503 ms apart (a real 2-rank run's): a grid of about the spacing put two in one bucket
    and none in the next, drawn as two gaps in a job's heatmap."""
    ts = np.cumsum(np.r_[0, [500, 499, 500, 499, 503, 496, 500]]).astype(np.int64) * 1000
    b = minmax_matrix(ts, np.ones((8, 2), np.float32), 200)
    assert not np.isnan(b.mean).any()


def test_an_interval_change_leaves_no_stripes():
    """100 ms, then 1 s for the last third of the snapshots: the slower part is not striped with empty buckets
    (it read as lost data)."""
    ts = np.r_[np.arange(600) * 100_000, 60_000_000 + np.arange(1, 301) * 1_000_000].astype(np.int64)
    b = minmax_matrix(ts, np.ones((900, 1), np.float32), 1500)
    assert not np.isnan(b.mean).any()
