"""Columns and tables that grow by appends in amortised O(new), for rules that keep per-step state."""

from __future__ import annotations

from typing import Any

import numpy as np

GROWTH = 4  # growing columns and tables grow by 1/GROWTH: appends stay amortised O(new) (each value is copied
# about GROWTH times), and at most a fifth of a node-day of per-step state is room not yet used (doubling: half)


class Appendable:
    """A numpy column that grows by a share (`GROWTH`): appends cost O(new) amortised, reads are views. With `narrow`,
    integers are kept as int32 while every value fits (half the memory of a rule's per-step columns: step
    numbers, durations) and as int64 from the first that does not; they read back as int64 either way."""

    def __init__(self, dtype: Any = np.int64, *, narrow: bool = False) -> None:
        self._data = np.empty(0, np.int32 if narrow else dtype)
        self._narrow = narrow
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        if self._data.dtype == np.int32 and len(values) and not _fits_int32(values):
            self._data = self._data.astype(np.int64)
        need = self.n + len(values)
        if need > len(self._data):
            grown = np.empty(max(need, len(self._data) + len(self._data) // GROWTH, 1024), self._data.dtype)
            grown[: self.n] = self._data[: self.n]
            self._data = grown
        self._data[self.n: need] = values
        self.n = need

    def view(self) -> np.ndarray:
        data = self._data[: self.n]
        return data.astype(np.int64) if data.dtype == np.int32 else data


def _fits_int32(values: np.ndarray) -> bool:
    return int(values.min()) >= -(1 << 31) and int(values.max()) < (1 << 31)


def _store(table: np.ndarray, rows: np.ndarray | slice, values: np.ndarray) -> np.ndarray:
    """`table[rows] = values`, first widening an int32 table to int64 when a value does not fit; the table."""
    if table.dtype == np.int32 and np.size(values) and not _fits_int32(np.asarray(values)):
        table = table.astype(np.int64)
    table[rows] = values
    return table
