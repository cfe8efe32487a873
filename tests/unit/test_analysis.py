"""analysis: the split of RSS at one moment (breakdown), and the findings and verdict drawn
from hand-built figures, at and around each threshold of docs/numbers.md."""

import math
from dataclasses import replace

import pytest

from heapsight import analysis
from heapsight.model import Breakdown, HeapFigures, Hold, Release

MiB = 1 << 20
GLIBC_HEADER = 8
CMD = ["./server", "--port", "80"]


def bd(**kw) -> Breakdown:
    """A final breakdown: zero everywhere but what is given; rss the sum of the parts."""
    f = dict(live_bytes=0, waste_bytes=0, metadata_bytes=0, retained_bytes=0, file_bytes=0,
             baseline_anon_bytes=0, other_anon_bytes=0, untouched_bytes=0)
    f.update(kw)
    f.setdefault("non_heap_bytes", f["file_bytes"] + f["baseline_anon_bytes"] + f["other_anon_bytes"])
    f.setdefault("rss_bytes", f["live_bytes"] + f["waste_bytes"] + f["metadata_bytes"]
                 + f["retained_bytes"] + f["non_heap_bytes"])
    return Breakdown(at_s=1.0, **f)


def heap(allocator="glibc", arenas=1, threads=1, n_large_heap=0, size_classes=()) -> HeapFigures:
    return HeapFigures(allocator=allocator, n_alloc=1000, n_free=900, live_blocks=100,
                       live_requested_bytes=0, live_usable_bytes=0, peak_live_usable_bytes=0,
                       peak_live_requested_bytes=0, peak_at_s=0.5, requested_total_bytes=0,
                       n_mmapped=0, n_large_heap=n_large_heap, arenas=arenas, threads_seen=threads,
                       size_classes=size_classes, helper_mallocs=0)


NOT_MEASURED = Release(False, "malloc_trim(0)", why_not="the program was killed")


def released(gave_back: int) -> Release:
    return Release(True, "malloc_trim(0)", rss_before_bytes=100 * MiB,
                   rss_after_bytes=100 * MiB - gave_back)


def kinds(final, release=NOT_MEASURED, figures=None, **kw) -> list:
    return [(f.kind, f.bytes) for f in analysis.findings(CMD, final, release, figures or heap(), **kw)]


def resident_total(b: Breakdown) -> int:
    return sum(b.parts().values())


# breakdown ----------------------------------------------------------------------------

def test_rows_add_up_to_rss_when_nothing_is_untouched():
    # GIVEN 100 MiB resident, 80 MiB of it anonymous, 2 MiB of that before main();
    # 1000 live blocks holding 40 MiB requested, 42 MiB usable; the allocator's mapped
    # memory unknown
    b = analysis.breakdown(1.23456, rss=100 * MiB, anon=80 * MiB, baseline_anon=2 * MiB,
                           live_req=40 * MiB, live_usable=42 * MiB, live_blocks=1000,
                           allocator="glibc")
    # THEN every byte of anonymous heap memory malloc does not explain is retained
    assert b == Breakdown(at_s=1.235, rss_bytes=100 * MiB, live_bytes=40 * MiB,
                          waste_bytes=2 * MiB, metadata_bytes=1000 * GLIBC_HEADER,
                          retained_bytes=36 * MiB - 8000, non_heap_bytes=22 * MiB,
                          file_bytes=20 * MiB, baseline_anon_bytes=2 * MiB,
                          other_anon_bytes=0, untouched_bytes=0)
    # and the rows add up to RSS
    assert (b.live_bytes + b.waste_bytes + b.metadata_bytes + b.retained_bytes
            + b.non_heap_bytes) == b.rss_bytes
    assert b.parts() == {"live": 40 * MiB, "waste": 2 * MiB, "metadata": 8000,
                         "retained": 36 * MiB - 8000, "non-heap": 22 * MiB}


def test_alloc_mapped_bounds_retained_and_the_rest_is_non_heap():
    # GIVEN the same moment, but the allocator says it holds only 60 MiB from the OS
    b = analysis.breakdown(1.0, 100 * MiB, 80 * MiB, 2 * MiB, 40 * MiB, 42 * MiB, 1000,
                           "glibc", alloc_mapped=60 * MiB)
    # THEN retained is at most mapped - usable - headers; the other anonymous memory
    # (stacks, the program's own mmap) is non-heap
    assert b.retained_bytes == 60 * MiB - 42 * MiB - 8000
    assert b.other_anon_bytes == 18 * MiB
    assert b.non_heap_bytes == 20 * MiB + 2 * MiB + 18 * MiB
    assert (b.live_bytes + b.waste_bytes + b.metadata_bytes + b.retained_bytes
            + b.non_heap_bytes) == b.rss_bytes == 100 * MiB


def test_alloc_mapped_above_the_anonymous_memory_changes_nothing():
    unbounded = analysis.breakdown(1.0, 100 * MiB, 80 * MiB, 2 * MiB, 40 * MiB, 42 * MiB, 1000, "glibc")
    loose = analysis.breakdown(1.0, 100 * MiB, 80 * MiB, 2 * MiB, 40 * MiB, 42 * MiB, 1000, "glibc",
                               alloc_mapped=500 * MiB)
    assert loose == unbounded


def test_alloc_mapped_below_live_leaves_nothing_retained():
    b = analysis.breakdown(1.0, 100 * MiB, 80 * MiB, 2 * MiB, 40 * MiB, 42 * MiB, 1000, "glibc",
                           alloc_mapped=10 * MiB)
    assert b.retained_bytes == 0 and b.other_anon_bytes == 36 * MiB - 8000


def test_live_beyond_anonymous_memory_is_untouched():
    # GIVEN 50 MiB allocated in one block, of which the program touched only a little:
    # 12 MiB resident, 10 MiB anonymous, 1 MiB before main()
    b = analysis.breakdown(2.0, 12 * MiB, 10 * MiB, 1 * MiB, 50 * MiB, 50 * MiB, 1, "glibc")
    # THEN what live bytes exceed the heap's anonymous memory by is untouched, nothing retained
    assert b.untouched_bytes == 50 * MiB + GLIBC_HEADER - 9 * MiB
    assert b.retained_bytes == 0 and b.other_anon_bytes == 0
    assert b.live_bytes == 50 * MiB > b.rss_bytes
    # and the resident parts (live less untouched) still add up to RSS
    assert b.parts() == {"live": 9 * MiB - GLIBC_HEADER, "waste": 0, "metadata": GLIBC_HEADER,
                         "retained": 0, "non-heap": 3 * MiB}
    assert resident_total(b) == b.rss_bytes


@pytest.mark.parametrize("allocator, header", [("glibc", 8), ("mmap", 16), ("jemalloc", 0),
                                               ("tcmalloc", 0), ("mimalloc", 0), ("unknown", 0)])
def test_metadata_is_the_allocators_header_per_live_block(allocator, header):
    b = analysis.breakdown(0.0, 64 * MiB, 60 * MiB, 0, MiB, MiB, 4096, allocator)
    assert b.metadata_bytes == header * 4096
    assert resident_total(b) == b.rss_bytes


def test_file_backed_memory_is_never_the_heaps():
    # all of RSS is file-backed (a program that maps a file and allocates nothing)
    b = analysis.breakdown(0.0, 30 * MiB, 0, 0, 0, 0, 0, "glibc")
    assert b.file_bytes == b.non_heap_bytes == 30 * MiB
    assert b.retained_bytes == b.live_bytes == b.baseline_anon_bytes == 0


def test_anonymous_memory_below_the_baseline_is_all_baseline():
    b = analysis.breakdown(0.0, 5 * MiB, 1 * MiB, 3 * MiB, 0, 0, 0, "glibc")
    assert b.baseline_anon_bytes == 1 * MiB and b.retained_bytes == 0
    assert b.non_heap_bytes == 5 * MiB


def test_split_works_element_by_element():
    # two moments at once, the second with the mapped figure unknown (NaN)
    parts = analysis.split([100 * MiB, 100 * MiB], [80 * MiB, 80 * MiB], 2 * MiB,
                           [40 * MiB, 40 * MiB], [42 * MiB, 42 * MiB], [1000, 1000], "glibc",
                           [60 * MiB, math.nan])
    assert list(parts["retained_bytes"]) == [18 * MiB - 8000, 36 * MiB - 8000]
    assert list(parts["other_anon_bytes"]) == [18 * MiB, 0]


def test_timeline_without_the_library_is_all_non_heap():
    # allocator None: /proc figures only; a missing anonymous reading counts as all of RSS
    parts = analysis.timeline_split({"rss": [10 * MiB, 20 * MiB], "anon": [4 * MiB, math.nan]},
                                    0, None)
    assert parts["non_heap_bytes"].tolist() == [10 * MiB, 20 * MiB]
    assert parts["file_bytes"].tolist() == [6 * MiB, 0]
    assert parts["baseline_anon_bytes"].tolist() == [4 * MiB, 20 * MiB]
    assert not parts["retained_bytes"].any() and not parts["live_bytes"].any()


# findings -----------------------------------------------------------------------------

def test_no_final_breakdown_no_findings():
    assert analysis.findings(CMD, None, NOT_MEASURED, heap()) == []


def test_never_freed_from_one_mib_and_half_of_the_heap():
    assert kinds(bd(live_bytes=MiB, retained_bytes=MiB // 2)) == [("never-freed", MiB)]
    assert kinds(bd(live_bytes=MiB - 1)) == []                  # under 1 MiB
    # live is half the heap (live + waste + metadata + retained): still a finding
    half = bd(live_bytes=2 * MiB, waste_bytes=MiB // 4, metadata_bytes=MiB // 4,
              retained_bytes=3 * MiB // 2, file_bytes=100 * MiB)
    assert kinds(half) == [("never-freed", 2 * MiB)]
    # less than half: not
    assert "never-freed" not in dict(kinds(bd(live_bytes=2 * MiB, waste_bytes=2 * MiB + 1)))


def test_never_freed_tells_how_live_bytes_grew():
    final = bd(live_bytes=8 * MiB)
    f, = analysis.findings(CMD, final, NOT_MEASURED, heap(),
                           live_over_time=((0.5, 2 * MiB), (1.25, 8 * MiB)))
    assert f.title == "8.0 MiB still allocated at exit"
    assert "Live bytes over the run: 2.0 MiB at 0.50 s, 8.0 MiB at 1.25 s. " in f.detail
    assert f.suggestions == ("heaptrack ./server --port 80",
                             "valgrind --leak-check=full --show-leak-kinds=definite ./server --port 80")
    # a single point says nothing about growth
    f, = analysis.findings(CMD, final, NOT_MEASURED, heap(), live_over_time=((1.0, 8 * MiB),))
    assert "Live bytes over the run" not in f.detail
    # a program killed by a signal did not end: its blocks are those it held when it was
    f, = analysis.findings(CMD, final, NOT_MEASURED, heap(), killed=9)
    assert f.title == "8.0 MiB still allocated when it was killed (signal 9)"
    assert f.detail.startswith("The program was killed (signal 9): ")


def test_retention_from_one_mib_and_a_tenth_of_rss():
    # GIVEN retained memory and a large non-heap part setting RSS
    def with_retained(r, rss):
        return bd(retained_bytes=r, file_bytes=rss - r)
    assert kinds(with_retained(MiB, 10 * MiB)) == [("retention", MiB)]
    assert kinds(with_retained(MiB - 1, 5 * MiB)) == []            # under 1 MiB
    assert kinds(with_retained(2 * MiB, 20 * MiB)) == [("retention", 2 * MiB)]   # exactly 10%
    assert kinds(with_retained(2 * MiB, 20 * MiB + 1)) == []        # just under 10%


def test_release_that_gave_back_half_is_retention_less_is_fragmentation():
    final = bd(retained_bytes=40 * MiB, live_bytes=MiB // 2, file_bytes=10 * MiB)
    gave_half, = analysis.findings(CMD, final, released(20 * MiB), heap())
    assert gave_half.kind == "retention"
    assert "gave back 20.0 MiB (50% of it)" in gave_half.detail
    assert gave_half.title == "40.0 MiB freed by the program but kept by glibc"
    gave_little, = analysis.findings(CMD, final, released(20 * MiB - 1), heap())
    assert gave_little.kind == "fragmentation"
    assert "gave back only 20.0 MiB" in gave_little.detail and "fragmentation" in gave_little.detail
    # a release that grew RSS gave back nothing
    assert Release(True, "x", rss_before_bytes=MiB, rss_after_bytes=2 * MiB).gave_back_bytes == 0


def test_fragmentation_puts_the_release_that_gave_little_last_with_what_it_gave():
    # GIVEN 40 MiB retained of which a release gives back 10 MiB (a program that already
    # called malloc_trim(0) itself: python3 keeping 1 of 100 1000-byte objects)
    final = bd(retained_bytes=40 * MiB, live_bytes=MiB // 2, file_bytes=10 * MiB)
    f, = analysis.fit_to_run(analysis.findings(CMD, final, released(10 * MiB), heap()), {}, "",
                             ["./server", "--port", "80"])
    assert f.kind == "fragmentation"
    assert "no release returns a page that holds a live block" in f.detail
    # THEN the settings come first, measured by --verify, and malloc_trim last, with what the
    # release gave back
    assert f.suggestions[0].startswith("heapsight run --verify -- ./server --port 80   #")
    assert f.suggestions[1].startswith("LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ")
    trims = [x for x in f.suggestions if "malloc_trim" in x]
    assert trims == list(f.suggestions[-len(trims):]) and len(trims) == 2
    assert all(x.endswith("(measured at exit: it gives back 10.0 MiB of the 40.0 MiB)")
               for x in trims), trims
    # where a release gives back half, retention: the release first, as before
    r, = analysis.fit_to_run(analysis.findings(CMD, final, released(20 * MiB), heap()), {}, "",
                             ["./server", "--port", "80"])
    assert r.kind == "retention" and r.suggestions[0].startswith("malloc_trim(0);   # in the program")


def test_free_space_beyond_all_the_program_freed_is_the_allocators_own():
    # GIVEN 76 MiB free in glibc's heap (bounded by its resident pages at exit) where the
    # program freed 100 KiB in all: 20,000 blocks of 100 bytes aligned to 4096
    import dataclasses
    final = bd(retained_bytes=76 * MiB, live_bytes=2 * MiB, file_bytes=2 * MiB)
    h = dataclasses.replace(heap(), freed_usable_bytes=100 * 1024, resident_at_exit_bytes=80 * MiB)
    f, = analysis.fit_to_run(analysis.findings(CMD, final, released(0), h), {}, "", CMD)
    # THEN it is not "freed by the program": the title says how much the program never freed,
    # the detail names glibc's alignment padding, and the code change comes first
    assert f.kind == "fragmentation"
    assert f.title == "76.0 MiB kept free by glibc, 75.9 MiB of it never freed by the program"
    assert "The program freed 100.0 KiB in all" in f.detail and "posix_memalign" in f.detail
    assert f.suggestions[0].startswith("posix_memalign(&slab, 4096, n * size);   #")
    # a Python script is not told to change C code
    g, = analysis.findings(["python3", "x.py"], final, released(0), h)
    assert not any(x.startswith("posix_memalign") for x in g.suggestions)
    # where the program freed more than that, or the heap's resident pages are not known
    # (another mapping could be read as retained), the finding is as before
    for other in (dataclasses.replace(h, freed_usable_bytes=200 * MiB),
                  dataclasses.replace(h, resident_at_exit_bytes=None)):
        f, = analysis.findings(CMD, final, released(0), other)
        assert f.title == "76.0 MiB freed by the program but kept by glibc", f.title


def test_unmeasured_release_is_retention_with_the_reason():
    f, = analysis.findings(CMD, bd(retained_bytes=40 * MiB), NOT_MEASURED, heap())
    assert f.kind == "retention"
    assert "no release could be measured (the program was killed)" in f.detail


def test_glibc_retention_names_arenas_and_large_heap_blocks():
    # GIVEN 8 arenas for 16 threads and 3 large blocks that came from the heap
    f, = analysis.findings(CMD, bd(retained_bytes=40 * MiB), released(30 * MiB),
                           heap(arenas=8, threads=16, n_large_heap=3))
    assert "8 malloc arenas" in f.detail and "16 threads seen" in f.detail
    assert "3 blocks of 128 KiB or more came from the heap" in f.detail
    # several threads' arenas: the setting the lab's remedies experiment shows working first,
    # the code change next, and the glibc tunables it shows doing little last, said so
    assert f.suggestions[0].startswith("LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 heapsight run -- ./server --port 80   # jemalloc")
    assert "(heapsight lab remedies)" in f.suggestions[0]
    assert f.suggestions[1].startswith("malloc_trim(0);   # in the program")
    weak = [x for x in f.suggestions if "GLIBC_TUNABLES" in x]
    assert weak and all("less than 30% for this pattern" in x for x in weak)
    assert f.suggestions.index(weak[0]) > 2
    # one arena: the release in the program first (no lab rule for one thread)
    one, = analysis.findings(CMD, bd(retained_bytes=40 * MiB), released(30 * MiB),
                             heap(arenas=1, threads=1, n_large_heap=3))
    assert one.suggestions[0].startswith("malloc_trim(0);   # in the program")
    assert one.suggestions[1].startswith("heapsight attach PID --trim   # for the running program")
    assert ("GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072 heapsight run -- ./server --port 80"
            in one.suggestions)
    assert one.suggestions[-1].startswith("LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ")
    # one arena and no large heap block: neither is named nor suggested
    f, = analysis.findings(CMD, bd(retained_bytes=40 * MiB), released(30 * MiB), heap())
    assert "malloc arenas" not in f.detail and "came from the heap" not in f.detail
    assert len(f.suggestions) == 3   # the code change, heapsight's own call, jemalloc's
    assert not any("ARENA" in x or "TUNABLES" in x for x in f.suggestions)


def test_other_allocators_retention_has_their_own_advice_not_glibcs():
    f, = analysis.findings(CMD, bd(retained_bytes=40 * MiB), released(30 * MiB),
                           heap(allocator="jemalloc", arenas=4))
    assert f.title == "40.0 MiB freed by the program but kept by jemalloc"
    # why: jemalloc's decay; what to try: its own setting and release call, measured by
    # --verify; nothing of glibc's (malloc_trim, arenas, tunables)
    assert "Why it stayed: jemalloc keeps freed pages dirty" in f.detail, f.detail
    assert f.suggestions[0].startswith("LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 "
                                       "MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 heapsight run")
    assert f.suggestions[1].startswith('mallctl("arena.4096.purge"')
    assert "--verify" in f.suggestions[2]
    text = " ".join(f.suggestions) + f.detail.split("Why it stayed", 1)[1]
    assert "malloc_trim" not in text and "ARENA_MAX" not in text and "GLIBC_TUNABLES" not in text


def test_waste_from_one_mib_and_a_quarter_of_the_usable_bytes():
    classes = ((32, 5000, 4000, 20.0, 80), (48, 100, 90, 30.0, 9), (1024, 10, 10, 1000.0, 3))
    # 1 MiB wasted of 4 MiB usable: 25%, a finding, with the estimate's standard error
    final = bd(live_bytes=3 * MiB, waste_bytes=MiB, retained_bytes=0, file_bytes=20 * MiB)
    est = replace(heap(size_classes=classes), live_waste_error_bytes=40 * 1024)
    f = [x for x in analysis.findings(CMD, final, NOT_MEASURED, est) if x.kind == "waste"]
    assert len(f) == 1 and f[0].bytes == MiB
    assert f[0].title == ("1.0 MiB lost to rounding (±40.0 KiB, estimated from the sampled "
                          "blocks): 25% of the usable bytes of live blocks were not requested")
    # the class named is the one wasting most in total (live blocks x mean waste)
    assert "blocks of 32+ usable bytes (about 4,000 live), which waste 20.0 bytes each" in f[0].detail
    # just under a quarter, or under 1 MiB: none
    assert "waste" not in dict(kinds(bd(live_bytes=3 * MiB + 1, waste_bytes=MiB)))
    assert "waste" not in dict(kinds(bd(live_bytes=0, waste_bytes=MiB - 1)))


def test_waste_without_size_classes_still_reads():
    f, = analysis.findings(CMD, bd(live_bytes=0, waste_bytes=2 * MiB, metadata_bytes=0),
                           NOT_MEASURED, heap())
    # (sampling off: the waste is all allocations' share, exact, and no class is named)
    assert f.kind == "waste" and f.detail.startswith("Every block is rounded up") and "±" not in f.title


def test_non_heap_from_four_mib_and_a_tenth_of_rss():
    assert kinds(bd(other_anon_bytes=4 * MiB, file_bytes=36 * MiB)) == [("non-heap", 4 * MiB)]
    assert kinds(bd(other_anon_bytes=4 * MiB - 1)) == []
    assert kinds(bd(other_anon_bytes=4 * MiB, file_bytes=36 * MiB + 1)) == []


EVERYTHING = dict(live_bytes=40 * MiB, waste_bytes=14 * MiB, retained_bytes=20 * MiB,
                  other_anon_bytes=100 * MiB)


def test_findings_are_sorted_by_size():
    # GIVEN each of the four over its threshold, non-heap (the last one looked at) largest
    assert kinds(bd(**EVERYTHING)) == [("non-heap", 100 * MiB), ("never-freed", 40 * MiB),
                                       ("retention", 20 * MiB), ("waste", 14 * MiB)]


def test_hold_findings_name_the_stretch_and_whose_memory():
    kept = Hold(0.25, 1.5, 100 * MiB, 120 * MiB, 2 * MiB, 100 * MiB, 0, "retained")
    f, = analysis.hold_findings([kept], "glibc", CMD, arenas=4)
    assert (f.kind, f.bytes) == ("hold", 100 * MiB)
    assert f.title == "100.0 MiB held beyond live bytes from 0.25 s to 1.50 s"
    assert "(up to 120.0 MiB)" in f.detail and "glibc kept" in f.detail
    # threads' arenas: the lab's rule (jemalloc returning pages at once) first
    assert f.suggestions[0].startswith("LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 heapsight run -- ./server --port 80")
    assert analysis.hold_findings([kept], "jemalloc", CMD)[0].suggestions == ()
    # one arena: no lab rule; the tunable, said to be unmeasured, and --verify to measure it
    one = analysis.hold_findings([kept], "glibc", CMD, arenas=1)[0].suggestions
    assert one[0].startswith(
        "GLIBC_TUNABLES=glibc.malloc.trim_threshold=131072 heapsight run -- ./server --port 80")
    assert "--verify measures it" in one[0] and one[1].startswith("heapsight run --verify --")
    # anonymous memory malloc did not give: pymalloc's arenas for a Python program
    other = Hold(0.0, 2.0, 50 * MiB, 60 * MiB, MiB, 0, 50 * MiB, "non-heap")
    py, = analysis.hold_findings([other], "glibc", ["python3", "job.py"])
    assert "did not come from malloc" in py.detail
    assert py.suggestions[0].startswith(
        "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 PYTHONMALLOC=malloc "
        "MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 heapsight run -- python3 job.py")
    assert analysis.hold_findings([other], "glibc", CMD)[0].suggestions == ()
    assert analysis.hold_findings([], "glibc", CMD) == []


# verdict ------------------------------------------------------------------------------

def test_verdict_without_samples_or_without_the_library():
    assert analysis.verdict([], None, True) == \
        "no samples: the program ended before the first measurement"
    assert analysis.verdict([], bd(file_bytes=3 * MiB), False) == (
        "heap figures unavailable (the preload library was not active); RSS only: final 3.0 MiB")


def test_verdict_healthy_names_rss_and_live():
    final = bd(live_bytes=512 * 1024, file_bytes=10 * MiB)
    assert analysis.findings(CMD, final, NOT_MEASURED, heap()) == []
    assert analysis.verdict([], final, True) == (
        "healthy: little memory left allocated, retained or wasted (final RSS 10.5 MiB, "
        "of which 512.0 KiB live)")


def test_verdict_leads_with_the_largest_finding_and_lists_the_rest():
    final = bd(**dict(EVERYTHING, other_anon_bytes=MiB))
    found = analysis.findings(CMD, final, released(MiB), heap())
    assert analysis.verdict(found, final, True) == (
        "NEVER FREED: 40.0 MiB still allocated at exit (also: fragmentation, small-object waste)")
    found = analysis.findings(CMD, bd(**EVERYTHING), released(MiB), heap())
    assert analysis.verdict(found, bd(**EVERYTHING), True) == (
        "NON-HEAP MEMORY: 100.0 MiB of anonymous memory did not come from malloc "
        "(also: never freed, fragmentation, small-object waste)")
    one = analysis.findings(CMD, bd(retained_bytes=8 * MiB), NOT_MEASURED, heap())
    assert analysis.verdict(one, bd(retained_bytes=8 * MiB), True) == \
        "RETENTION: 8.0 MiB freed by the program but kept by glibc"


def test_the_reasons_memory_stayed_lead_with_the_most_bytes():
    # GIVEN 50 MiB retained: 45 MiB of it in pages pinned by a few live blocks (the exit's
    # heap map), one large block served from the heap, and no release that helped
    final = bd(live_bytes=10 * MiB, retained_bytes=50 * MiB, file_bytes=40 * MiB)
    (f,) = [x for x in analysis.findings(["prog"], final, released(0), heap(n_large_heap=1),
                                         mapped={"pinned": 45 * MiB})
            if x.kind in ("retention", "fragmentation")]
    why = f.detail.split("Why it stayed: ")[1]
    # THEN the pinned pages come first, the large block second, the unmeasured rule last;
    # and one block is "1 block"
    pinned, large, bins = why.index("45.0 MiB of heap pages"), why.index("1 block of 128 KiB"), \
        why.index("free chunks stay")
    assert pinned < large < bins, why
    assert "1 blocks" not in why and "instead of its own mmap" in why


def test_never_freed_says_how_much_of_it_was_never_touched():
    # GIVEN 673 MiB still allocated at exit, 601 MiB of it never written (xz -9's shape)
    final = bd(live_bytes=673 * MiB, untouched_bytes=601 * MiB, file_bytes=2 * MiB,
               rss_bytes=75 * MiB)
    (f,) = [x for x in analysis.findings(["xz", "-9"], final, released(0), heap())
            if x.kind == "never-freed"]
    # THEN the finding says so (it counted the 601 MiB without a word), in its headline too
    assert "601.0 MiB of it was never touched" in f.detail
    assert f.title == ("673.0 MiB still allocated at exit (601.0 MiB of it never touched: "
                       "address space, not RSS)")
    small = bd(live_bytes=673 * MiB, file_bytes=2 * MiB)
    (g,) = [x for x in analysis.findings(["xz"], small, released(0), heap()) if x.kind == "never-freed"]
    assert "never touched" not in g.detail and "never touched" not in g.title


def test_a_perl_or_python_program_is_told_to_trim_the_running_service_not_to_include():
    # GIVEN the same retention in a C server and in perl and python programs
    for cmd, code in ((CMD, "malloc_trim(0);   # in the program"),
                      (["perl", "app.pl"], "heapsight attach PID --trim   # for the running service"),
                      (["/usr/bin/python3.11", "app.py"], 'ctypes.CDLL("libc.so.6").malloc_trim(0)')):
        f, = analysis.findings(cmd, bd(retained_bytes=40 * MiB), released(30 * MiB),
                               heap(arenas=4, threads=4))
        # THEN the change in the program's code is in its language: an interpreter cannot
        # include malloc.h
        assert f.suggestions[1].startswith(code), (cmd, f.suggestions)
        assert any("#include" in x for x in f.suggestions) == (cmd is CMD)
    for cmd, first in ((CMD, "malloc_trim(0);   # in the program, after the work"),
                       (["perl", "app.pl"], "heapsight attach PID --trim   # for the running service"),
                       # a Python script can call it itself (it was told only to attach)
                       (["python3", "app.py"], 'ctypes.CDLL("libc.so.6").malloc_trim(0)   # in the script')):
        f, = analysis.findings(cmd, bd(retained_bytes=40 * MiB), released(30 * MiB),
                               heap(arenas=1, threads=1))
        assert f.suggestions[0].startswith(first), (cmd, f.suggestions)
        # AND a setting that needs no code change follows for each, a one-shot script's too
        # (a perl one-liner was told only to attach to a service it is not)
        assert any(x.startswith("LD_PRELOAD=") and "libjemalloc" in x
                   for x in f.suggestions[1:]), (cmd, f.suggestions)


def owner(name, peak, at_exit, n=10):
    return {"object": name, "owner": analysis.owner_of(name), "peak_bytes": peak,
            "mapped_bytes": at_exit, "mappings": n}


def test_non_heap_names_the_objects_that_mapped_it_and_only_their_rules():
    final = bd(other_anon_bytes=200 * MiB)
    # GIVEN cc1 mapping its garbage-collected heap
    f, = analysis.findings(["cc1", "x.c"], final, NOT_MEASURED, heap(),
                           mapped_by=(owner("/usr/libexec/gcc/x86_64-linux-gnu/12/cc1",
                                            268 * MiB, 219 * MiB),))
    # THEN the finding names it, with its figures and its rule, and nothing generic
    assert f.kind == "non-heap"
    assert "GCC's garbage-collected heap (ggc): 268.0 MiB mapped at most, 219.0 MiB at exit, " \
           "in 10 mappings" in f.detail
    assert "ggc-min-expand" in f.detail and "pymalloc" not in f.detail
    assert "Thread stacks" not in f.detail and "  " not in f.detail
    # GIVEN node's V8 heap: no advice about sending objects to malloc
    f, = analysis.findings(["node", "app.js"], final, NOT_MEASURED, heap(),
                           mapped_by=(owner("/usr/bin/node", 190 * MiB, 150 * MiB),))
    assert "Node.js (the V8 heap): 190.0 MiB mapped at most" in f.detail and "--trace-gc" in f.detail
    assert "malloc makes it visible" not in f.detail and "PYTHONMALLOC" not in f.detail
    assert f.suggestions == () and "  " not in f.detail
    # GIVEN no object that mapped as much: the generic words, said as such
    f, = analysis.findings(CMD, final, NOT_MEASURED, heap(),
                           mapped_by=(owner("/usr/lib/libfoo.so", 2 * MiB, MiB),))
    assert "no object heapsight saw mapping memory accounts for it" in f.detail


def test_a_pymalloc_hold_says_what_is_known_not_that_survivors_keep_arenas():
    held = Hold(0.0, 2.0, 180 * MiB, 182 * MiB, MiB, 0, 180 * MiB, "non-heap")
    f, = analysis.hold_findings([held], "glibc", ["python3", "job.py"],
                                mapped_by=(owner("/usr/bin/python3.11", 182 * MiB, MiB),))
    # THEN it is named for what it is (outside malloc), not as memory held beyond live bytes
    assert f.title == "180.0 MiB outside malloc from 0.00 s to 2.00 s"
    assert "the CPython object allocator (pymalloc arenas): 182.0 MiB mapped at most" in f.detail
    assert "Whether it holds live objects or free space cannot be told" in f.detail
    assert "a few survivors keep whole arenas" not in f.detail
    assert "PYTHONMALLOC=malloc sends CPython's objects to malloc" in f.detail
    # PYTHONMALLOC=malloc alone raises what is held (the lab): jemalloc under it first, and
    # the release in the script's own words
    assert f.suggestions[0].startswith(
        "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 PYTHONMALLOC=malloc")
    assert any(x.startswith('ctypes.CDLL("libc.so.6").malloc_trim(0)') for x in f.suggestions)
    alone = next(x for x in f.suggestions if x.startswith("PYTHONMALLOC=malloc heapsight run"))
    assert "less than 30% for this pattern" in alone


def test_a_reservation_is_told_from_what_is_resident():
    # GIVEN the JVM: 7.9 GiB mapped, 1.3 MiB of it resident at the last reading
    jvm = dict(owner("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so", 7900 * MiB,
                     7900 * MiB, 60), resident_bytes=int(1.3 * MiB), resident_at_s=0.03)
    assert analysis.owner_words(jvm) == (
        "the JVM (Java heap, metaspace, code cache): 1.3 MiB resident at 0.03 s (7.7 GiB mapped "
        "at most, 7.7 GiB at exit, in 60 mappings, most of it address space reserved, never "
        "touched)")
    # THEN a non-heap finding is explained by the resident part, not by the reservation
    f, = analysis.findings(["java", "-version"], bd(other_anon_bytes=5 * MiB), NOT_MEASURED,
                           heap(), mapped_by=(dict(jvm, resident_bytes=4 * MiB),))
    assert "the JVM (Java heap, metaspace, code cache): 4.0 MiB resident" in f.detail


def test_a_change_against_glibc_is_called_only_outside_the_repeats_noise():
    from heapsight import ranking
    base = {"median": 0.5, "min": 0.30, "max": 0.66}
    # overlapping ranges: about the same, however far the medians are
    assert ranking.change("wall_s", {"median": 0.25, "min": 0.2, "max": 0.35}, base) == "~"
    # apart: the change of the medians
    c = ranking.change("wall_s", {"median": 0.1, "min": 0.09, "max": 0.12}, base)
    assert ranking.change_text(c) == "-80%"
    # bytes given back are never a percentage (0 B against 0 B, or -100%)
    assert ranking.change("given_back", {"median": 0, "min": 0, "max": 0},
                          {"median": 5 << 20, "min": 5 << 20, "max": 5 << 20}) is None
    assert ranking.change_text(None) == ""


def test_a_runtime_that_unmaps_its_heap_as_it_exits_is_named_by_what_it_held_while_it_ran():
    # GIVEN V8: 85 MiB resident near peak RSS, none at the last reading (node unmaps its
    # heap before heapsight's exit figures), 600 MiB mapped in reservations
    v8 = dict(owner("/usr/bin/node", 600 * MiB, MiB, 280), resident_bytes=0, resident_at_s=0.84,
              resident_peak_bytes=85 * MiB, resident_peak_at_s=0.48)
    assert analysis.owner_words(v8) == (
        "Node.js (the V8 heap): 0 B resident at 0.84 s, 85.0 MiB near peak RSS at 0.48 s "
        "(600.0 MiB mapped at most, 1.0 MiB at exit, in 280 mappings, most of it address "
        "space reserved, never touched)")
    # THEN the hold of 80 MiB while it ran is put on V8 (by what it held then), with V8's rule
    held = Hold(0.2, 0.8, 80 * MiB, 85 * MiB, 2 * MiB, 0, 80 * MiB, "non-heap")
    f, = analysis.hold_findings([held], "glibc", ["node", "app.js"], mapped_by=(v8,))
    assert "Node.js (the V8 heap): 85.0 MiB resident at 0.48 s" in f.detail
    assert "--trace-gc" in f.detail and "Thread stacks" not in f.detail


def test_a_mostly_possibly_lost_heap_at_exit_is_named_for_it():
    # GIVEN mawk at exit: 7.5 MiB in pools only inner pointers lead to, 150 KiB reachable
    from heapsight.analysis import reach_findings
    final = Breakdown(1.0, 10 << 20, 7_800_000, 0, 0, 0, 2 << 20, 2 << 20, 0, 0, 0)
    reach = {"definitely_lost_bytes": 0, "indirectly_lost_bytes": 0,
             "definitely_lost_blocks": 0, "indirectly_lost_blocks": 0,
             "possibly_lost_bytes": 7_876_608, "possibly_lost_blocks": 3846,
             "still_reachable_bytes": 154_214, "still_reachable_blocks": 31}
    (f,) = reach_findings(reach, final, 7_900_000, "", "", "awk")
    # THEN the headline says the larger part, and the text does not call it all "not a leak"
    assert f.title.startswith("7.7 MiB kept until exit, 7.5 MiB of it possibly lost"), f.title
    assert not f.detail.startswith("Not a leak") and "The other 150.6 KiB is not a leak" in f.detail
    # and with little possibly lost, the headline is the reachable bytes
    reach.update(possibly_lost_bytes=4096, possibly_lost_blocks=1, still_reachable_bytes=7_876_608)
    (f,) = reach_findings(reach, final, 7_900_000, "", "", "awk")
    assert f.title == "7.5 MiB kept until exit, still reachable" and f.detail.startswith("Not a leak")


def test_the_runtime_a_process_maps_is_named_from_its_files():
    from heapsight.analysis import runtime_loaded
    assert runtime_loaded(["/usr/bin/python3.11", "/lib/x86_64-linux-gnu/libc.so.6"]) == \
        "the CPython object allocator (pymalloc arenas)"
    assert runtime_loaded(["/usr/bin/java", "/usr/lib/jvm/java-17/lib/server/libjvm.so"]) == \
        "the JVM (Java heap, metaspace, code cache)"
    # a program that only links libc, or maps anonymous memory: none
    assert runtime_loaded(["/usr/bin/sqlite3", "/lib/x86_64-linux-gnu/libc.so.6", "[heap]", ""]) == ""


def test_free_tops_of_thread_heaps_are_retention_with_the_threshold_to_fix():
    # GIVEN 24 MiB retained at exit, 22 MiB of it the free tops of thread heaps (the exit
    # map's "thread_tops"), and a release that gave back 1 MiB
    from heapsight.analysis import _retention_finding
    final = Breakdown(1.0, 30 << 20, 2 << 20, 0, 0, 24 << 20, 4 << 20, 4 << 20, 0, 0, 0)
    heap = HeapFigures("glibc", 100, 90, 10, 2 << 20, 2 << 20, 30 << 20, 30 << 20, 0.5,
                       40 << 20, 1, 0, 2, 2, (), 0, None, 0)
    release = Release(True, "malloc_trim(0)", "", 30 << 20, 29 << 20, 30 << 20, 29 << 20, 0.001)
    f = _retention_finding(final, release, heap, {"thread_tops": 22 << 20}, ["prog"], "prog")
    # THEN it is retention that malloc_trim cannot reach, with the tunable first (24 MiB:
    # too little for another allocator's start to pay off)
    assert f.kind == "retention" and "top of the threads' heaps" in f.detail
    assert "trim_threshold=131072" in f.suggestions[0]
    # and with 64 MiB in many threads' heaps, the lab's rule first, the tunable after it
    big = Breakdown(1.0, 80 << 20, 2 << 20, 0, 0, 64 << 20, 14 << 20, 4 << 20, 0, 0, 0)
    g = _retention_finding(big, release, heap, {"thread_tops": 60 << 20}, ["prog"], "prog")
    assert g.suggestions[0].startswith("LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert any("trim_threshold=131072" in x for x in g.suggestions[2:])
    assert not any("malloc_trim(0)'" in s for s in f.suggestions)
    # and without the tops it stays fragmentation
    f = _retention_finding(final, release, heap, {}, ["prog"], "prog")
    assert f.kind == "fragmentation"


def test_jemalloc_is_said_to_need_installing_only_where_it_is_missing(monkeypatch):
    # GIVEN retention in a C program, with jemalloc's library installed, then not
    from heapsight import remedies
    for err, tail in ((None, "# jemalloc returning freed pages at once"),
                      ("not installed", "# jemalloc returning freed pages at once; apt-get "
                                        "install libjemalloc2")):
        monkeypatch.setattr(remedies, "library_for", lambda cfg, e=err: (None, e))
        f, = analysis.findings(CMD, bd(retained_bytes=40 * MiB), released(30 * MiB),
                               heap(arenas=1, threads=1))
        line, = [x for x in f.suggestions if x.startswith("LD_PRELOAD=") and "jemalloc" in x]
        # THEN the command says what the setting does, and "apt-get install" only when missing
        assert line.endswith(tail), line


def test_the_age_of_the_retention_at_the_end_counts_from_when_its_frees_were_over():
    # GIVEN jq's end: 160 MiB freed from 0.88 to 0.98 s (retained rising), main returning
    # at 1.044 s with 181 MiB retained
    t = [0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98, 1.00, 1.02, 1.044]
    r = [0.5, 0.5, 0.5, 30, 70, 110, 150, 176, 181, 181, 181]
    age = analysis.retention_age(t, [x * MiB for x in r], len(t) - 1, 181 * MiB)
    # THEN its age is from the last sample below 90% of it (0.96 s): 84 ms, its own cleanup
    assert abs(age - 0.084) < 1e-9 and analysis.young(age)
    # AND freed, then kept 0.2 s before the end (hs-retention): not young
    t2 = [0.10, 0.117, 0.14, 0.2, 0.25, 0.3, 0.329]
    r2 = [0.3, 64.6, 64.6, 64.6, 64.6, 64.6, 64.6]
    age2 = analysis.retention_age(t2, [x * MiB for x in r2], len(t2) - 1, int(64.6 * MiB))
    assert age2 > analysis.HOLD_MIN_S and not analysis.young(age2)
    # (no end row, or nothing retained: no age, and never young)
    assert analysis.retention_age(t, r, None, 181 * MiB) is None and not analysis.young(None)


def test_cpythons_objects_are_never_retained_whatever_glibcs_figure_allows():
    # GIVEN readings of pymalloc's pools at 1 s (3 MiB of objects) and 2 s (1 MiB), and
    # samples before, between, at and after them
    readings = [(1.0, 3 * MiB, 4 * MiB), (2.0, 1 * MiB, 4 * MiB)]
    floor = analysis.objects_floor([0.5, 1.0, 1.5, 2.0, 2.5], readings)
    # THEN between them, the lesser (a drop between two readings is never taken for
    # non-heap), nothing outside them
    assert list(floor) == [0.0, 1 * MiB, 1 * MiB, 1 * MiB, 0.0]
    # AND the split gives retained no more than what is left beside them, where glibc's
    # figure (after a trim: pages it gave back still counted) would allow it all
    parts = analysis.split(rss=20 * MiB, anon=12 * MiB, baseline_anon=MiB, live_req=MiB,
                           live_usable=MiB, live_blocks=0, allocator="glibc",
                           alloc_mapped=100 * MiB, not_malloc=3 * MiB)
    assert parts["retained_bytes"] == 7 * MiB and parts["other_anon_bytes"] == 3 * MiB


def test_a_child_named_as_the_command_is_not_offered_to_follow():
    # GIVEN git gc, whose 61 MiB child is a git too (git pack-objects): --follow git would
    # measure the started git again
    kids = [{"name": "git", "pid": 42, "peak_rss_bytes": 61 * MiB}]
    f, = analysis.child_findings(kids, 6 * MiB, ["git", "gc", "--aggressive"])
    # THEN the finding names it and says why --follow cannot pick it, and offers no line
    assert "cannot single this one out" in f.detail and f.suggestions == ()
    # a child of another name (or a versioned name of another program) still gets its line
    kids = [{"name": "python3.11", "pid": 43, "peak_rss_bytes": 61 * MiB}]
    f, = analysis.child_findings(kids, 6 * MiB, ["sh", "-c", "python3 x.py"])
    assert f.suggestions == ("heapsight run --follow python3.11 -- sh -c 'python3 x.py'",)
    f, = analysis.child_findings(kids, 6 * MiB, ["python3", "x.py"])
    assert f.suggestions == () and "(python3)" in f.detail
