"""The named moments (moments.py): held is the most RSS kept through a stretch as long as
the hold rule's, wherever it is in the run; end is the last sample before the exit began."""

from __future__ import annotations

import numpy as np

from heapsight import moments
from heapsight.model import Breakdown

MiB = 1 << 20


def series(*steps, hz=100):
    """A timeline from (seconds, MiB) steps."""
    t, rss = [], []
    now = 0.0
    for secs, mib in steps:
        n = int(round(secs * hz))
        t += [now + i / hz for i in range(n)]
        rss += [mib * MiB] * n
        now += n / hz
    return np.array(t), np.array(rss, dtype=float)


def at(rss):
    return lambda i: Breakdown(float(i), int(rss[i]), 0, 0, 0, 0, 0, 0, 0, 0, 0)


def test_a_spike_is_the_peak_and_the_plateau_is_held():
    t, rss = series((0.5, 10), (0.05, 300), (2.0, 145), (0.2, 20))
    i, lo, hi = moments.held(t, rss, duration_s=t[-1])
    assert rss[i] == 145 * MiB
    # the stretch at 145 MiB or more: from the spike (itself above) to the drop
    assert abs(t[lo] - 0.5) < 0.02 and abs(t[hi] - 2.54) < 0.02


def test_a_stretch_shorter_than_the_window_is_not_held():
    # 150 ms at 200 MiB is shorter than the 0.2 s a stretch must last: held is the 50
    t, rss = series((1.0, 50), (0.15, 200), (1.0, 50))
    i, _, _ = moments.held(t, rss, duration_s=t[-1])
    assert rss[i] == 50 * MiB


def test_the_window_grows_with_the_run():
    # in a 100 s run a stretch must last 5 s: 3 s at 400 MiB does not count
    t, rss = series((40, 100), (3, 400), (57, 100), hz=10)
    i, _, _ = moments.held(t, rss, duration_s=100)
    assert rss[i] == 100 * MiB


def test_a_run_shorter_than_the_window_has_no_held_moment():
    t, rss = series((0.1, 10))
    assert moments.held(t, rss, duration_s=0.1) is None


def test_end_is_the_last_sample_before_the_exit_began_and_held_ends_there():
    # the program idles at 145 MiB, its exit begins at 2.5 s, then teardown grows RSS
    t, rss = series((0.5, 10), (2.0, 145), (1.0, 400))
    found = moments.build(t, rss, at(rss), t[-1], int(np.argmax(rss)), len(t) - 1,
                          Breakdown(3.6, 5 * MiB, 0, 0, 0, 0, 0, 0, 0, 0, 0), 2.5,
                          "main returned")
    names = [m.name for m in found]
    assert names == ["peak", "held", "end", "exit"]
    by = {m.name: m for m in found}
    assert by["end"].at_s < 2.5 and by["end"].breakdown.rss_bytes == 145 * MiB
    assert "main returned" in by["end"].how
    assert by["held"].breakdown.rss_bytes == 145 * MiB   # teardown's 400 is not held
    assert by["peak"].breakdown.rss_bytes == 400 * MiB
    assert moments.rss_of(found, "exit") == 5 * MiB
    assert moments.rss_of([{"name": "held", "breakdown": {"rss_bytes": 7}}], "held") == 7


def test_the_verdict_is_about_its_first_findings_moment():
    from heapsight.model import Finding
    assert moments.about([Finding("hold", 1, "", "")]) == "held"
    assert moments.about([Finding("retention", 1, "", "")]) == "end"
    assert moments.about([Finding("leak", 1, "", "")]) == "exit"
    assert moments.about([]) == "peak"
