"""The named moments (moments.py): held is the most RSS kept through a stretch as long as
the hold rule's, wherever it is in the run; end is the moment the exit began: the library's
reading of it, or the last sample before."""

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
    i, lo, hi = moments.held(t, rss)
    assert rss[i] == 145 * MiB
    assert abs(t[lo] - 0.55) < 0.02 and abs(t[hi] - 2.54) < 0.02


def test_a_stretch_shorter_than_the_minimum_is_not_held():
    # 150 ms at 200 MiB is shorter than the 0.2 s a stretch must last
    t, rss = series((0.1, 50), (0.15, 200), (0.1, 30))
    assert moments.held(t, rss) is None


def test_the_longest_steady_stretch_wins_and_the_higher_of_equals():
    t, rss = series((3, 100), (1, 400), (3, 100), hz=10)
    i, _, _ = moments.held(t, rss)
    assert rss[i] == 100 * MiB
    t, rss = series((1, 100), (1, 400), hz=100)
    i, _, _ = moments.held(t, rss)
    assert rss[i] == 400 * MiB


def test_steady_allows_a_tenth_and_reads_the_median():
    # an idle service wobbling between 140 and 150 MiB for 2 s after a 1 s climb
    steps = [(0.01, 10 + 140 * k / 100) for k in range(100)]
    steps += [(0.1, 140 + (k % 2) * 10) for k in range(20)]
    t, rss = series(*steps)
    i, lo, _ = moments.held(t, rss)
    assert 140 * MiB <= rss[i] <= 150 * MiB and t[lo] >= 0.9


def test_a_run_with_nothing_steady_has_no_held_moment():
    t, rss = series(*[(0.01, 10 * 1.2 ** k) for k in range(40)])
    assert moments.held(t, rss) is None


def test_the_climb_to_the_peak_is_not_held():
    # a service climbs for 1 s to 150 MiB, drops to 73 MiB and idles for 1 s
    steps = [(0.01, 10 + 140 * k / 100) for k in range(100)] + [(1.0, 73)]
    t, rss = series(*steps)
    i, _, _ = moments.held(t, rss)
    assert rss[i] == 73 * MiB


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


def test_a_program_shorter_than_its_samples_is_read_at_its_exit():
    # one sample at the start (2 MiB), the exit probe's reading at 6 MiB 30 ms later
    t, rss = np.array([0.0]), np.array([2.0 * MiB])
    final = Breakdown(0.03, 6 * MiB, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    found = {m.name: m for m in moments.build(t, rss, at(rss), 0.03, 0, 0, final, 0.028,
                                              "main returned")}
    assert found["peak"].breakdown.rss_bytes == 6 * MiB     # the most RSS read
    assert found["end"].breakdown is final                  # no sample near the end
    assert "held" not in found
    # but not CPython's: its exit reading follows the teardown that freed its work's memory
    # (a tick late on a loaded machine is no reason to show that as its end)
    found = {m.name: m for m in moments.build(t, rss, at(rss), 0.03, 0, 0, final, 0.028,
                                              "CPython began finalizing")}
    assert found["end"].at_s == 0.0 and found["end"].breakdown.rss_bytes == 2 * MiB


def test_the_librarys_reading_as_the_exit_began_is_the_end():
    # ticks at 145 MiB until 2.49 s; the library's own row at 2.495 s (the program freed a
    # cache as its last act: 60 MiB then), teardown after it
    from heapsight.summary import end_reading
    t, rss = series((0.5, 10), (2.0, 145))
    t, rss = np.append(t, [2.495, 2.6]), np.append(rss, [60 * MiB, 400 * MiB])
    end_i = end_reading({"t": t, "rss": rss}, 2.495, 2.495)
    assert end_i == len(t) - 2
    found = {m.name: m for m in moments.build(t, rss, at(rss), t[-1], int(np.argmax(rss)),
                                              len(t) - 1, None, 2.495, "main returned", end_i)}
    assert found["end"].at_s == 2.495 and found["end"].breakdown.rss_bytes == 60 * MiB
    assert found["end"].how == "read as main returned"
    # CPython's finalizing read by the library (its first flush after it): the same
    found = {m.name: m for m in moments.build(t, rss, at(rss), t[-1], int(np.argmax(rss)),
                                              len(t) - 1, None, 2.495, "CPython began finalizing",
                                              end_i)}
    assert found["end"].at_s == 2.495 and found["end"].how == "read as CPython began finalizing"
    # CPython's finalizing seen by a tick is that tick's own time, not the library's reading:
    # the end is the sample before it, never it
    assert end_reading({"t": t, "rss": rss}, 2.49, 2.495) is None
    assert end_reading({"t": t, "rss": rss}, 2.495, None) is None
    # a run without the library's row (a seccomp filter, an older record): no row at end_s
    assert end_reading({"t": t[:-2], "rss": rss[:-2]}, 2.495, 2.495) is None



def test_a_hold_is_the_held_moment_where_the_process_sat_longer_elsewhere():
    # GIVEN rounds that hold 100 MiB for 0.4 s, then 1 s idle at 14 MiB (the longest steady
    # stretch), the hold rule's stretch being 0.1-0.5 s
    t, rss = series((0.1, 5), (0.4, 100), (1.0, 14))
    b = at(rss)
    steady = {m.name: m for m in moments.build(t, rss, b, 1.5, 20, len(t) - 1, None, None, "")}
    held = {m.name: m for m in moments.build(t, rss, b, 1.5, 20, len(t) - 1, None, None, "",
                                             hold=(0.1, 0.5))}
    # THEN without the hold, held is the idle end; with it, the hold's stretch at its RSS
    assert steady["held"].breakdown.rss_bytes == 14 * MiB
    assert held["held"].breakdown.rss_bytes == 100 * MiB
    assert (held["held"].start_s, held["held"].end_s) == (0.1, 0.5)
    assert held["held"].how == moments.HELD_HOW["hold"]
    # AND a hold no sample falls in leaves held as it was
    none = {m.name: m for m in moments.build(t, rss, b, 1.5, 20, len(t) - 1, None, None, "",
                                             hold=(9.0, 9.5))}
    assert none["held"].breakdown.rss_bytes == 14 * MiB


def test_a_stretch_is_read_where_the_allocator_was_read_near_its_middle():
    # GIVEN a flat stretch of 11 samples, the allocator read at the 3rd and the 8th
    t = np.arange(11) * 0.05
    rss = np.full(11, 64.0 * MiB)
    exact = np.zeros(11, dtype=bool)
    exact[[2, 7]] = True
    # THEN a read sample, the one nearer the middle (t = 0.25): 0.35, not 0.10 (nor the first)
    assert moments.level(t, rss, np.arange(11), exact) == 7
    # AND where more was read at one of them (the objects known too), that one
    both = exact.astype(float)
    both[2] += 1
    assert moments.level(t, rss, np.arange(11), both) == 2
    # AND without readings, the middle; a sample far from the median is never taken
    assert moments.level(t, rss, np.arange(11)) == 5
    rss[5] = 80.0 * MiB
    assert moments.level(t, rss, np.arange(11)) in (4, 6)


def test_the_allocators_figure_is_tight_between_two_readings_that_agree():
    from heapsight import analysis
    nan = float("nan")
    # readings at 0, 3 and 6: 35 MiB, 5 MiB, 5 MiB; the exit's 5 MiB after the last sample
    m = [35.0, nan, nan, 5.0, nan, nan, 5.0, nan]
    # THEN between the first two (a free between them) only the readings themselves are
    # tight; between the last two, and after the last (the exit's agrees), all are
    assert analysis.mapped_tight(m, 5.0).tolist() == [True, False, False, True, True, True,
                                                      True, True]
    assert analysis.mapped_tight(m, 9.0).tolist()[-1] is False


def test_of_two_rows_that_each_know_one_figure_the_held_moment_reads_the_objects():
    # GIVEN a steady stretch: pymalloc's pools read until its second row (objects known
    # there), the allocator's mapped memory known from its third row on (a loaded machine
    # read the pools rarely: the held column was read where no objects were known)
    from heapsight.summary import known_at
    t = np.array([0.0, 0.5, 1.0, 1.5, 2.0])
    rss = np.full(5, 100.0 * (1 << 20))
    cols = {"alloc_mapped": np.array([np.nan, np.nan, 50.0, 50.0, 50.0])}
    cols["alloc_mapped"][0] = 40.0   # a reading that differs: the rows before the next are loose
    objects = np.array([np.nan, 80.0, np.nan, np.nan, np.nan])
    exact = known_at(cols, objects)
    # THEN the row read is the one where the objects are known, not the middle one
    assert moments.level(t, rss, np.arange(5), exact) == 1, exact
