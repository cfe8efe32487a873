"""compare's recommendation (ranking.recommend): the lowest RSS at exit among the
configurations that cost at most 25% more time, and of those about the same at exit (their
repeats overlap, or within a MiB or a tenth), the lowest peak RSS."""

from heapsight.ranking import recommend, stats_of

MiB = 1 << 20


def row(name, final_mib, peak_mib, wall_s):
    """A configuration whose three repeats spread by 2% around each figure."""
    runs = [{"peak_rss": peak_mib * MiB * f, "final_rss": final_mib * MiB * f, "retained": 0,
             "given_back": 0, "wall_s": wall_s * f, "cpu_s": wall_s * f, "minor_faults": 1000}
            for f in (0.99, 1.0, 1.01)]
    return {"name": name, "ok": True, "stats": stats_of(runs), "about": name, "how": name}


def test_of_two_the_same_at_exit_the_lower_peak_is_recommended():
    # a thread heap's free top: both settings return it at exit, one keeps the peak low
    rows = [row("glibc", 26.1, 26.1, 0.020), row("glibc-trim128k", 2.1, 4.6, 0.020),
            row("glibc-mmap128k", 2.0, 12.9, 0.023)]
    assert recommend(rows).startswith("glibc-trim128k:")


def test_a_lower_rss_at_exit_beyond_the_noise_still_wins():
    rows = [row("glibc", 26.1, 26.1, 0.020), row("glibc-trim128k", 8.0, 4.6, 0.020),
            row("glibc-mmap128k", 2.0, 12.9, 0.023)]
    assert recommend(rows).startswith("glibc-mmap128k:")


def test_nothing_better_keeps_the_defaults():
    rows = [row("glibc", 26.1, 26.1, 0.020), row("jemalloc", 25.9, 26.0, 0.020)]
    assert recommend(rows).startswith("keep glibc's defaults")
