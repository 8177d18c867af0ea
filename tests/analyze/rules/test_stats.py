"""The rules' exact statistics: column medians equal numpy's nanmedian, and merged distributions give the statistics of
all their values, however they were split."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from stallwatch.analyze.rules.kit.stats import Distribution, ValueCounts, column_medians


@pytest.mark.parametrize("seed", range(40))
def test_column_medians_equal_numpys_nanmedian(seed):
    rng = np.random.default_rng(seed)
    rows, columns = int(rng.integers(0, 70)), int(rng.integers(0, 200))
    matrix = rng.integers(0, 10**6, (rows, columns)).astype(float) * (0.37 if seed % 2 else 1.0)
    matrix[rng.random((rows, columns)) < rng.random()] = np.nan  # absent steps; some columns all absent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanmedian(matrix, axis=0) if rows else np.full(columns, np.nan)
    assert np.array_equal(column_medians(matrix), expected, equal_nan=True)


@pytest.mark.parametrize("decimals, dtype, digits", [(2, np.float32, 2), (2, np.float32, 5), (None, np.float64, 3)])
def test_merged_distributions_give_the_statistics_of_all_their_values(decimals, dtype, digits):
    """On the grid of counts, off it (values it cannot hold: sorted arrays), and one side on it, one off."""
    rng = np.random.default_rng(7)
    parts = [np.round(rng.uniform(0, 100, n), digits) for n in (0, 1, 2500, 700)]
    parts[2][::50] = np.nan
    whole, merged = Distribution(decimals, dtype), Distribution(decimals, dtype)
    for part in parts:
        whole.add(part)
        one = Distribution(decimals, dtype)
        one.add(part)
        merged.merge(one)
    assert merged.n == whole.n and merged.summary() == whole.summary() and merged.box_stats() == whole.box_stats()
    assert all(np.array_equal(a, b) for a, b in zip(merged.histogram(20), whole.histogram(20), strict=True))


def test_merged_value_counts_give_the_statistics_of_all_their_values():
    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 50, n).astype(float) for n in (3000, 0, 10, 4000)]
    whole, merged = ValueCounts(), ValueCounts()
    for part in parts:
        whole.add(part)
        one = ValueCounts()
        one.add(part)
        merged.merge(one)
    assert merged.n == whole.n == 7010 and merged.summary() == whole.summary()
    assert len(merged._values) <= 50  # still distinct values and counts, not the values themselves
