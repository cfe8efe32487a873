"""Which reading is the peak column (summary.peak_live_row): the one with the most live
bytes, unless the library's exact peak fell between two readings and a reading before it
is off by less than one after it (which counts what was freed since as retained)."""

import numpy as np

from heapsight.summary import peak_live_row

MiB = 1 << 20


def rows(*readings):
    """(t, live MiB, rss MiB) per reading -> the arrays peak_live_row takes."""
    t, live, rss = (np.asarray([r[i] for r in readings], dtype=float) for i in range(3))
    return live * MiB, rss * MiB, np.arange(len(readings)), t


def test_the_most_live_bytes_when_a_reading_saw_the_peak():
    live, rss, valid, t = rows((0.1, 100, 110), (0.2, 256, 262), (0.3, 4, 262))
    assert peak_live_row(live, rss, valid, t, 0.15, 256 * MiB) == 1
    # (without the library's peak, the same)
    assert peak_live_row(live, rss, valid) == 1


def test_of_equal_live_bytes_the_highest_rss():
    # a block malloc'd, then written: the same live bytes while RSS grows
    live, rss, valid, t = rows((0.1, 512, 20), (0.2, 512, 300), (0.3, 512, 530), (0.4, 0, 10))
    assert peak_live_row(live, rss, valid, t, 0.05, 512 * MiB) == 2


def test_a_reading_before_a_missed_peak_beats_one_after_it_short_by_more_than_half():
    # the peak (256 MiB at 0.14 s) fell between 0.13 s (240 live) and 0.15 s (246 live,
    # with 22 MiB freed since shown as retained)
    live, rss, valid, t = rows((0.11, 200, 205), (0.13, 240, 245), (0.15, 246, 277), (0.3, 4, 262))
    assert peak_live_row(live, rss, valid, t, 0.14, 256 * MiB) == 1


def test_a_reading_after_a_missed_peak_when_the_one_before_is_far_short():
    # the program rose to its peak in one burst and freed; later it came back near it
    live, rss, valid, t = rows((0.5, 100, 105), (1.5, 10, 300), (5.0, 298, 305))
    assert peak_live_row(live, rss, valid, t, 1.0, 300 * MiB) == 2


def test_the_library_lag_is_not_a_missed_peak():
    # the library's peak is ahead of what a reading saw by what threads held back (< 1 MiB)
    live, rss, valid, t = rows((0.1, 200, 205), (0.2, 255.5, 270), (0.3, 4, 262))
    assert peak_live_row(live, rss, valid, t, 0.15, 256 * MiB) == 1
