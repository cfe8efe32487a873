"""When the terminal gives live blocks never touched a row of their own: a material part
of RSS, or of the live bytes (else the live row reads far below the peak's figure)."""

from heapsight.model import Breakdown
from heapsight.reporters.terminal import _untouched_shown

KiB, MiB = 1 << 10, 1 << 20


def column(rss, live, untouched):
    return Breakdown(0.0, rss, live, 0, 0, 0, rss - live, rss - live, 0, 0, untouched)


def test_a_tenth_of_the_live_bytes_has_a_row_though_small_beside_rss():
    # gcc: 172 KiB live, 85 KiB of it never touched, in 3.7 MiB of RSS
    assert _untouched_shown(column(int(3.7 * MiB), 87 * KiB, 85 * KiB))


def test_a_mib_and_a_percent_of_rss_has_a_row_whatever_the_live_bytes():
    assert _untouched_shown(column(100 * MiB, 95 * MiB, 2 * MiB))


def test_skew_sized_figures_have_none():
    # under 64 KiB: a /proc read and a counters read a moment apart
    assert not _untouched_shown(column(4 * MiB, 100 * KiB, 60 * KiB))
    # a small share of both
    assert not _untouched_shown(column(200 * MiB, 150 * MiB, 512 * KiB))
    assert not _untouched_shown(None)
