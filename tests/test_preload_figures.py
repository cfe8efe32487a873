"""Figures the preload library publishes that must hold whatever the program does: the
peak with more threads than there are slots."""

from conftest import scenario

MiB = 1024 * 1024


def test_peak_with_more_threads_than_slots_is_not_below_live(hs):
    # GIVEN 300 threads (the segment has 255 thread slots: 45 count in the shared slot)
    # that all hold 128 KiB at once, then free it all before they end
    r = hs(scenario("hs-threads"), "--threads", "300", "--rounds", "5", "--keep-kb", "128",
           "--free-kept", "1", timeout=60)
    assert r.rc == 0, r.stderr
    held = int(r.truth("threads")["kept_bytes"])
    h, peak = r.summary["heap"], r.summary["peak"]
    # THEN the peak is the moment they all held their blocks: the usable bytes (1032 per
    # 1 KiB block under glibc) within the library's bounded slack (1 MiB over all threads)
    assert h["peak_live_usable_bytes"] >= held - 1 * MiB, (h["peak_live_usable_bytes"], held)
    # and never below the live bytes the sampler saw at its own peak sample
    sampled = peak["live_bytes"] + peak["waste_bytes"]
    assert h["peak_live_usable_bytes"] >= sampled - 1 * MiB, (h["peak_live_usable_bytes"], sampled)
    assert h["live_blocks"] >= 0


def test_a_deepbind_plugin_is_counted_both_ways(hs):
    # GIVEN a plugin loaded with RTLD_DEEPBIND (its libc ahead of the preload) that hands
    # out 2000 small blocks the program frees, and 4 MiB + its constructor's 1 MiB it keeps
    r = hs(scenario("hs-dlopen"), "--deepbind", "1", "--small", "2000")
    assert r.rc == 0, r.stderr
    plugin = int(r.truth("dlopen")["plugin_live_bytes"])
    h = r.summary["heap"]
    # THEN its allocations went through the hooks like its frees: no negative counts, and
    # the kept bytes are live
    assert h["live_blocks"] >= 2
    assert h["n_alloc"] >= 2000 + 3 and h["n_free"] >= 2000 + 1
    assert plugin <= h["live_requested_bytes"] <= plugin + 256 * 1024


def test_heapsights_own_allocations_are_not_the_programs(hs):
    # GIVEN /bin/true, which allocates nothing itself (heapsight's start-up does: the helper
    # thread's TLS vector from pthread_create, the loader's records of the unwinder)
    r = hs("/bin/true")
    assert r.rc == 0, r.stderr
    h = r.summary["heap"]
    # THEN the program's figures hold none of it: 4 allocations and 664 B were shown
    assert (h["n_alloc"], h["n_free"], h["live_blocks"], h["live_usable_bytes"]) == (0, 0, 0, 0)
    assert h["peak_live_usable_bytes"] == 0


def test_heapsights_own_tables_are_not_the_programs_memory(hs):
    # GIVEN python3 building 250,000 dicts (about 100 samples: the sampled blocks' tables,
    # byte map and unwind rules are written in the program; pymalloc's arenas make ~2 MiB of
    # anonymous memory outside malloc), run with sampling and without
    argv = ("/usr/bin/python3", "-c", "d = [{'k': i, 'v': 'x' * 300} for i in range(250000)]")
    on, off = hs(*argv), hs(*argv, opts=["--sample-bytes", "0"])
    assert on.rc == 0 and off.rc == 0, on.stderr + off.stderr
    # THEN heapsight's private memory was there (and said: the summary's own bytes grew by it)
    grew = on.summary["heapsight_rss_bytes"] - off.summary["heapsight_rss_bytes"]
    assert grew >= 128 << 10, grew
    # AND it is not the program's: the anonymous memory outside malloc is the same either
    # way, within what loading the unwinder's library writes (~60 KiB; it was ~300 KiB
    # before heapsight took its tables out)
    a, b = (r.summary["final"]["other_anon_bytes"] for r in (on, off))
    assert b > 1 << 20 and abs(a - b) <= 128 << 10, (a, b, grew)
