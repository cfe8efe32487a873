"""The sampler's Timeline on synthetic samples: bounded however long the run, every
extreme kept; and the per-sample bound on the allocator's memory (analysis.mapped_bound)."""

from __future__ import annotations

import math

import numpy as np

from heapsight import analysis
from heapsight.timeline import COLUMNS, IDX, Timeline


def fill(tl: Timeline, n: int, spike_at: int, dip_at: int) -> None:
    for i in range(n):
        row = [math.nan] * len(COLUMNS)
        row[IDX["t"]] = i / 1000
        row[IDX["rss"]] = 1e8 + (i % 97) + (5e8 if i == spike_at else 0) - (9e7 if i == dip_at else 0)
        row[IDX["live_usable"]] = 5e7 + (i % 89) + (3e8 if i == spike_at + 1 else 0)
        tl.append_row(row)


def test_a_long_run_is_thinned_to_the_bound_keeping_every_extreme():
    tl = Timeline(max_rows=20_000)
    fill(tl, 200_000, spike_at=1_234, dip_at=77_777)
    cols = tl.columns
    assert len(tl) <= 20_000
    assert tl.thinned == 200_000 - len(tl)
    t = np.asarray(cols["t"])
    assert np.all(np.diff(t) > 0)          # real samples, in time order
    rss = np.asarray(cols["rss"])
    assert rss.max() == 1e8 + 1_234 % 97 + 5e8   # the spike, exactly
    assert rss.min() == 1e8 + 77_777 % 97 - 9e7  # the dip, exactly
    assert np.asarray(cols["live_usable"]).max() == 5e7 + 1_235 % 89 + 3e8
    assert t[-1] == (200_000 - 1) / 1000   # the newest samples stay whole
    assert np.all(np.diff(t[-5_000:]) < 0.0011)


def test_a_short_run_is_kept_whole():
    tl = Timeline(max_rows=20_000)
    fill(tl, 5_000, spike_at=10, dip_at=20)
    assert len(tl) == 5_000 and tl.thinned == 0


def test_cut_after_drops_the_samples_after_a_moment():
    tl = Timeline()
    fill(tl, 100, spike_at=1, dip_at=2)
    tl.cut_after(0.0495)
    assert len(tl) == 50 and max(tl.columns["t"]) == 0.049


def test_each_sample_is_bounded_by_the_readings_around_it():
    nan = math.nan
    mapped = np.array([nan, 10, nan, nan, 5, nan])
    # before the first reading: the next one; between: the larger; after the last: exit's
    assert analysis.mapped_bound(mapped, 50).tolist() == [10, 10, 10, 10, 5, 50]
    # no exit reading: the last one carries on; no reading at all: unknown
    assert analysis.mapped_bound(mapped).tolist() == [10, 10, 10, 10, 5, 5]
    assert np.isnan(analysis.mapped_bound(np.array([nan, nan]))).all()


def test_timeline_split_rows_add_up_to_rss():
    cols = {"t": [0, 1, 2], "rss": [100, 200, 150], "anon": [80, 180, 130],
            "live_req": [10, 100, 20], "live_usable": [12, 110, 24], "n_alloc": [1, 10, 10],
            "n_free": [0, 0, 8], "alloc_mapped": [nan for nan in [math.nan] * 3]}
    parts = analysis.timeline_split(cols, 20, "glibc", final_mapped=150.0)
    total = sum(parts[f] for f in ("live_bytes", "waste_bytes", "metadata_bytes",
                                   "retained_bytes", "non_heap_bytes")) - parts["untouched_bytes"]
    assert total.tolist() == [100, 200, 150]

