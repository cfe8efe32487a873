"""Thinning long timelines for the page without losing their peaks: per bucket of samples,
keep the samples where each chosen column is lowest and highest (a min/max envelope).

A 10-minute run at 1 kHz has 600,000 samples; the page keeps at most a few per bucket
(2,000 buckets by default), so a chart stays a few thousand points however long the run.
The kept rows are real samples, in time order, so columns taken at them still agree with
each other (the parts of one RSS sample still add up to that sample's RSS).
"""

from __future__ import annotations

import math

import numpy as np

BUCKETS = 2000  # a chart is at most ~1,000 px wide: two extremes per pixel column suffice


def as_array(values) -> np.ndarray:
    """A list from a record (numbers and None) as float64, None as NaN."""
    return np.asarray(values, dtype=float)


def extreme_rows(columns: list, buckets: int = BUCKETS) -> np.ndarray:
    """Indices of the rows to keep, ascending: the first and last row, and in each of
    `buckets` runs of equal length the row of each column's minimum and of its maximum
    (NaN is ignored; a bucket where a column is all NaN adds nothing for that column).
    With no more than 2 x buckets rows, every row is kept."""
    n = len(columns[0]) if columns else 0
    if n <= 2 * buckets:
        return np.arange(n)
    per = math.ceil(n / buckets)
    nb = math.ceil(n / per)
    pad = nb * per - n
    starts = np.arange(nb) * per
    keep = [np.array([0, n - 1])]
    for col in columns:
        col = np.asarray(col, dtype=float)
        nan = np.isnan(col)
        for fill, pick in ((-np.inf, np.argmax), (np.inf, np.argmin)):
            a = np.where(nan, fill, col)
            if pad:
                a = np.concatenate([a, np.full(pad, fill)])
            idx = starts + pick(a.reshape(nb, per), axis=1)
            idx = idx[idx < n]
            keep.append(idx[~nan[idx]])
    return np.unique(np.concatenate(keep))


def bucket_rates(t: np.ndarray, counter: np.ndarray, buckets: int = BUCKETS) -> tuple:
    """The rate of a cumulative counter (allocations, frees) as (x, per_second): one point
    per sample while there are few, else the mean rate over each bucket (a per-sample rate
    at 1 kHz is mostly noise; the mean over a bucket is what happened in it). x is the
    middle of each interval; samples where the counter is NaN are skipped."""
    ok = ~np.isnan(counter) & ~np.isnan(t)
    t, c = t[ok], counter[ok]
    if len(t) < 2:
        return np.array([]), np.array([])
    if len(t) > 2 * buckets:
        edges = np.unique(np.linspace(0, len(t) - 1, buckets + 1).round().astype(int))
        t, c = t[edges], c[edges]
    dt = np.diff(t)
    dc = np.diff(c)
    good = dt > 0
    x = (t[:-1] + t[1:])[good] / 2
    return x, np.maximum(dc[good], 0) / dt[good]
