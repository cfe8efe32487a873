"""numpy's median and isin without their first-call cost: np.median, and np.unique without
an option (which np.isin calls), import numpy.ma on first use (25-30 ms of every run's end,
for a masked-array check heapsight never needs)."""

from __future__ import annotations

import math

import numpy as np


def median(values) -> float:
    """The median of values, NaN when one of them is NaN (as np.median)."""
    s = np.sort(np.asarray(values, dtype=float), axis=None)
    if not len(s) or math.isnan(s[-1]):   # (NaN sorts last)
        return math.nan
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else float((s[mid - 1] + s[mid]) / 2)


def isin(a, values) -> np.ndarray:
    """Whether each element of a is one of values (as np.isin): a binary search of each in
    the sorted values."""
    a = np.asarray(a)
    v = np.sort(np.asarray(values).ravel())
    if not len(v):
        return np.zeros(a.shape, dtype=bool)
    at = np.searchsorted(v, a)
    at[at == len(v)] = 0
    return v[at] == a
