"""fmt: every figure a person reads goes through here; the unit boundaries and the
shares are pinned so that a run, a comparison and a report print the same text."""

import pytest

from heapsight.fmt import cell, count, human, human_short, kib, metric, pct, seconds, share

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize("n, text", [
    (0, "0 B"),
    (1, "1 B"),
    (1023, "1023 B"),          # the last whole number of bytes
    (1024, "1.0 KiB"),         # 1024, not 1000, starts the next unit
    (1536, "1.5 KiB"),
    (MiB, "1.0 MiB"),
    (20 * MiB, "20.0 MiB"),
    (GiB + GiB // 4, "1.2 GiB"),   # 1.25 rounds half to even
    (3 * TiB, "3.0 TiB"),
    (2048 * TiB, "2048.0 TiB"),    # TiB is the last unit: no PiB
    (-2048, "-2.0 KiB"),           # a negative delta keeps its unit
    (1536.0, "1.5 KiB"),
])
def test_human_uses_iec_units_with_one_decimal(n, text):
    assert human(n) == text


@pytest.mark.parametrize("n, text", [
    (999, "999B"),
    (1000, "1.0KiB"),          # three digits at most: 1000 B already goes up a unit
    (6.1 * KiB, "6.1KiB"),
    (99.5 * KiB, "99.5KiB"),
    (100 * KiB, "100KiB"),     # from 100 on, no decimal
    (59.7 * MiB, "59.7MiB"),
    (264 * MiB, "264MiB"),
    (1023 * KiB, "1.0MiB"),
    (5 * TiB, "5.0TiB"),
])
def test_human_short_keeps_three_significant_digits_and_no_space(n, text):
    assert human_short(n) == text


@pytest.mark.parametrize("part, whole, text", [
    (1, 4, "25%"),
    (1, 3, "33%"),
    (2, 3, "67%"),
    (0, 5, "0%"),
    (5, 5, "100%"),
    (3, 2, "150%"),            # more than the whole is shown, not capped
    (1, 0, "n/a"),             # no whole: no share
    (1, -1, "n/a"),
])
def test_pct_is_a_whole_percentage_or_na(part, whole, text):
    assert pct(part, whole) == text


def test_share_takes_a_fraction():
    assert share(0.42) == "42%" and share(0) == "0%" and share(1) == "100%"


@pytest.mark.parametrize("key, value, long, short", [
    ("duration_s", 1.234, "1.234 s", "1.23s"),
    ("cpu_user_s", 0.0, "0.000 s", "0.00s"),
    ("minor_faults", 12345.0, "12,345", "12,345"),
    ("peak_rss_bytes", 1536, "1.5 KiB", "1.5KiB"),
    ("final_rss_bytes", 264 * MiB, "264.0 MiB", "264MiB"),
    ("peak_rss_bytes", None, "-", "-"),   # a configuration that did not run
])
def test_metric_formats_by_the_key_suffix(key, value, long, short):
    assert metric(key, value) == long
    assert metric(key, value, short=True) == short


def test_cells_counts_seconds_and_kib():
    assert cell(1.5) == "1.50" and cell(1234567) == "1,234,567" and cell("glibc") == "glibc"
    assert count(1234.6) == "1,235"
    assert seconds(0.5) == "0.500 s"
    assert kib(2048) == "2 KiB" and kib(1536 * 1000) == "1,500 KiB"
